"""Chronic or rotating: whether the others wait for the same rank step after step, or for a different one.

The straggler rule compares the ranks' means over the span, which name a rank
that is slow in most steps and average a rotation away: when a different rank
is last each step (uneven batches, work done by whichever rank draws it, a
noisy neighbour that moves), every rank's mean looks alike and what shows is
that all of them wait, read as communication.  ``gputop.model.slowest`` says
step by step which rank the others waited for; this module words it: a
chronic straggler's finding says how often its rank was the slowest, and a
rotation is a straggler finding of its own that blames no one rank.
"""

from __future__ import annotations

from collections.abc import Sequence

from gputop.diagnose.details import StragglerDetails
from gputop.diagnose.findings import Evidence, Finding
from gputop.diagnose.grading import grade_band
from gputop.diagnose.thresholds import STRAGGLER_WAIT_CRITICAL_FRAC, STRAGGLER_WAIT_WARN_FRAC
from gputop.diagnose.wording import pct, too_close_text
from gputop.model.figures import RankFigures, RunFigures
from gputop.model.slowest import ONE_RANK_MIN_PART, SlowestRanks, slowest_ranks
from gputop.model.statistics import median

# The ranks a rotation's title names by their share; the rest are counted.
NAMED_RANKS = 3


def step_pattern(ranks: Sequence[RankFigures]) -> SlowestRanks | None:
    """Which rank was the slowest in each step the ranks' windows compare; None without readiness to compare."""
    step_s = median([r.stats.step.p50_s for r in ranks if r.stats.step.p50_s])
    if not step_s or len(ranks) < 2:
        return None
    return slowest_ranks([(r.rank, r.windows) for r in ranks], step_s)


def chronic_text(pattern: SlowestRanks | None, rank: int, who: str) -> str:
    """'; it was the slowest in 96% of the last 200 steps' for a straggler that is the slowest whenever one is."""
    if pattern is None or pattern.one_rank != rank:
        return ""
    return f"; {who} was the slowest in {pct(pattern.share(rank)):.0f}% of the last {pattern.steps} steps"


def rotating_findings(run: RunFigures, pattern: SlowestRanks | None) -> list[Finding]:
    """A different rank is the slowest from step to step and the others wait for it: no one rank to blame."""
    if pattern is None or not pattern.rotates:
        return []
    step_s = pattern.step_s
    wait_frac = pattern.waited_s / step_s
    se = None if pattern.waited_se_s is None else pattern.waited_se_s / step_s
    severity, close = grade_band(wait_frac, se, STRAGGLER_WAIT_WARN_FRAC, STRAGGLER_WAIT_CRITICAL_FRAC)
    if severity is None and not close:
        return []
    threshold = STRAGGLER_WAIT_CRITICAL_FRAC if severity == "critical" else STRAGGLER_WAIT_WARN_FRAC
    title = (
        f"the slowest rank rotates: {shares_text(pattern)} of the last {pattern.steps} steps; "
        f"the others wait for it {pct(wait_frac):.0f}% of each step"
    )
    driven = pattern.input_driven
    if driven is not None:
        title += f": the one that drew the largest batch (forward length follows input size, ρ = {driven:.2f})"
    if severity is None:
        title += ("; " if driven is not None else ": ") + too_close_text(wait_frac, se, threshold, pattern.steps)
    top_part = max(pattern.slowest.values()) / pattern.decided_steps
    return [
        Finding(
            cause="straggler",
            severity=severity or "info",
            title=title,
            suggestion=UNEVEN_INPUTS_SUGGESTION if pattern.input_driven is not None else ROTATING_SUGGESTION,
            evidence=(
                Evidence(
                    "rotating_wait_pct",
                    pct(wait_frac),
                    pct(threshold),
                    "%",
                    spread=None if se is None else pct(2 * se),
                ),
                Evidence("slowest_rank_part_pct", pct(top_part), pct(ONE_RANK_MIN_PART), "%", op="<"),
            ),
            ranks=(),  # no one rank: a rank list that changed with the rotation would also restart the finding
            run_id=run.run_id,
            magnitude=wait_frac,
            cost_s=pattern.waited_s,  # what the typical rank waits for the slowest, each step
            step_s=step_s,
            details=StragglerDetails(rotating=True, slowest=pattern),
        )
    ]


def shares_text(pattern: SlowestRanks) -> str:
    """'rank 0 in 53%, rank 1 in 46%', the most frequent first; past NAMED_RANKS, '5 more ranks in 12%'."""
    shares = pattern.by_share()
    named = [f"rank {rank} in {pct(share):.0f}%" for rank, share in shares[:NAMED_RANKS]]
    rest = shares[NAMED_RANKS:]
    if rest:
        more = f"{len(rest)} more rank" + ("s" if len(rest) > 1 else "")
        named.append(f"{more} in {pct(sum(share for _, share in rest)):.0f}%")
    return ", ".join(named)


ROTATING_SUGGESTION = (
    "No one rank is slow: in each step a different rank is the last one ready and the others wait for it. Look for "
    "work that varies from batch to batch or falls on whichever rank draws it: uneven batch sizes or sequence "
    "lengths (bucket samples by length, pad to fixed shapes, or balance tokens across ranks), data-dependent "
    "branches in the model, logging, metrics or evaluation done by one rank chosen per step, and garbage "
    "collection pauses (gc.freeze() after start-up). On a shared machine, other programs moving between the "
    "ranks' cores do this too."
)


UNEVEN_INPUTS_SUGGESTION = (
    "The batches differ in size (texts padded to their longest, images of several sizes) and each step every rank "
    "waits for the one that drew the largest. Even the work out: group samples of similar length into batches (a "
    "length-grouped or bucketing sampler; Hugging Face's group_by_length=True), pad to a few fixed lengths, or pack "
    "sequences to a fixed number of tokens per rank."
)


def rotation_explains(rotation: Finding, communication: Finding) -> bool:
    """A rotation makes every rank wait in the exchange in turn: the communication that waiting explains is its symptom.

    Communication is its symptom when what remains of it, with the wait for the
    slowest rank taken out, is under its warn line, and the rotation itself is
    called (not info: too early in a live run, or too close to its line, it
    leaves the exchange to be judged on its own).
    """
    return (
        rotation.severity != "info"
        and communication.run_id == rotation.run_id
        and communication.severity != "info"
        and communication.magnitude - rotation.magnitude <= STRAGGLER_WAIT_WARN_FRAC
    )


def is_rotation(finding: Finding) -> bool:
    """A straggler finding that blames no one rank: a different one is the slowest from step to step."""
    return isinstance(finding.details, StragglerDetails) and finding.details.rotating
