"""straggler: most ranks wait for one whose own work takes longer, and in which phase.

Like communication, it shows up as exposed communication (gradient all-reduce
not hidden behind backward compute); the difference is that the others wait
for one rank, not for the exchange.  DDP synchronizes every step, so wall step
times are alike across ranks; what differs is how each rank's step divides
into its own work (``RankFigures.own_s``) and waiting.

When the slow rank's time goes outside the measured phases and its reporter
samples the training thread's stack, the title names the place in the user's
code that takes it ("rank 1 spends 38% of each step in `compute_metrics`
(train.py:57), after the optimizer step").  Step by step it says how often
that rank was the one the others waited for, and when a different rank is the
slowest from step to step, the finding is the rotation (``rules.rotating``).
"""

from __future__ import annotations

from dataclasses import dataclass

from gputop.combine import OWN_PHASES
from gputop.diagnose.details import StragglerDetails, WaitedIn
from gputop.diagnose.findings import Evidence, Finding
from gputop.diagnose.grading import grade_above, grade_band, measured
from gputop.diagnose.rules.data_loading import loader_suggestion
from gputop.diagnose.rules.rotating import chronic_text, rotating_findings, step_pattern
from gputop.diagnose.rules.slow_work import (
    Place,
    SlowPhase,
    masked_outside_work,
    masking_text,
    phase_text,
    slow_place,
)
from gputop.diagnose.thresholds import (
    STRAGGLER_WAIT_CRITICAL_FRAC,
    STRAGGLER_WAIT_WARN_FRAC,
    STRAGGLER_WARMUP_S,
)
from gputop.diagnose.wording import pct, ranks_text, too_close_text
from gputop.model.figures import RankFigures, RunFigures
from gputop.model.frames import span_frames
from gputop.model.slowest import SlowestRanks
from gputop.model.statistics import leave_one_out_medians, median


def straggler_findings(run: RunFigures, ranks_on_host: dict[str, int], run_age_s: float | None = None) -> list[Finding]:
    """Ranks whose own time stands out while the others wait for them in communication.

    ``run_age_s``: how long the run has been seen, when the figures are a live
    span; under ``STRAGGLER_WARMUP_S`` nothing is said of a rank's speed (``warming_up``).
    """
    # Step by step, which rank the others waited for: a rotation blames no one rank, whatever the means say.
    pattern = step_pattern(measured(run)) if run.world_size > 1 else None
    if pattern is not None and pattern.rotates:
        return warming_up(rotating_findings(run, pattern), run_age_s)
    ranks = [r for r in measured(run) if r.own_s is not None and r.stats.phases.exposed_comm_frac is not None]
    if len(ranks) < 2:
        return warming_up(loader_only_straggler_findings(run, ranks_on_host), run_age_s)
    slow = straggling(ranks)  # measure
    if slow is None:
        return []
    # Decide and grade.
    severity, close = grade_band(slow.wait_frac, slow.se, STRAGGLER_WAIT_WARN_FRAC, STRAGGLER_WAIT_CRITICAL_FRAC)
    if severity is None and not close and (not slow.masked or slow.wait_frac <= 0):
        return []
    worst = slow.worst
    phase, others_share, place = slow_place(worst, slow.waiting)
    # Hidden work is named only where the stacks show it: a place in the user's code outside the model.
    # Outside time that is merely longer (a rank descheduled between phases on a crowded CPU) has none.
    if slow.masked and (phase.name != "other" or place is None):
        return []
    step = worst.stats.step.mean_s
    frames = span_frames(worst)
    where = waited_in(worst, slow.waiting)
    finding = Finding(
        cause="straggler",
        severity=severity or "info",
        title=straggler_title(slow, phase, place, severity, pattern, where),
        suggestion=straggler_suggestion(worst, phase, ranks_on_host.get(worst.hello.hostname, 1), place),
        evidence=straggler_evidence(slow, phase, others_share, severity),
        ranks=tuple(slow.ranks),
        run_id=run.run_id,
        magnitude=slow.wait_frac,
        cost_s=slow.wait_frac * (step or 0.0),  # what every other rank waits each step
        step_s=step,
        waiting_ranks=tuple(r.rank for r in slow.waiting),
        frames=() if frames is None else (frames,),
        details=StragglerDetails(phase=phase.name, slowest=pattern, waited_in=where),
    )
    return warming_up([finding], run_age_s)


def waited_in(worst: RankFigures, waiting: list[RankFigures]) -> WaitedIn | None:
    """The kind of collective on the group where the others wait for ``worst``: None where the collectives say nothing.

    The last rank to reach a collective waits least in it, and its peers wait for it there: per kind and group, the
    waiting ranks' exposed time a step less the slow rank's, the median over them; the largest, when it is positive.
    Only stacks whose collectives the tap times say where (FSDP2's all-gathers before a block, its reduce-scatters
    after; TP's all-reduces): under DDP the one exchange is the gradient all-reduce, which the title already names.
    """
    if worst.stats.phases.source == "ddp" or not waiting:
        return None
    mine = {(c.kind, c.group): c.exposed_s for c in worst.stats.collectives if c.exposed_s is not None}
    best: WaitedIn | None = None
    for key, exposed in mine.items():
        theirs = [
            (c.exposed_s, c) for r in waiting for c in r.stats.collectives if (c.kind, c.group) == key and c.exposed_s
        ]
        if len(theirs) < (len(waiting) + 1) // 2:
            continue
        extra = (median([e for e, _ in theirs]) or 0.0) - exposed
        if extra > 0 and (best is None or extra > best.extra_s):
            typical = sorted(theirs, key=lambda pair: pair[0])[len(theirs) // 2][1]
            best = WaitedIn(typical, extra, worst.rank, tuple(r.rank for r in waiting))
    return best


@dataclass(frozen=True)
class Straggling:
    """The slow ranks of a run, the worst of them, and how long the others wait for it (``straggling``)."""

    ranks: list[int]  # every rank whose own time stands out, the worst among them
    worst: RankFigures
    excess: float  # the worst's own time over the others', as a share of its step
    waiting: list[RankFigures]  # the ranks that are not slow
    wait_frac: float  # what they wait for the worst beyond the exchange's own cost, as a share of the step
    se: float | None  # its standard error
    masked: bool  # no rank's own time stands out: the worst's outside work is masked by the exchange

    def threshold(self, severity: str | None) -> float:
        return STRAGGLER_WAIT_CRITICAL_FRAC if severity == "critical" else STRAGGLER_WAIT_WARN_FRAC


def straggling(ranks: list[RankFigures]) -> Straggling | None:
    """Whose own work stands out (past the line, else masked by the exchange), when they are a minority.

    The slow rank arrives last at the all-reduce, so its own exposed comm is the exchange's base cost, which
    every rank pays (communication's business).  What the others wait beyond that base is what the straggler
    costs them.  A difference of two shares: its error is theirs combined (the waiting ranks' typical one).
    """
    slow: list[tuple[RankFigures, float]] = []
    others_own = leave_one_out_medians([r.own_s or 0.0 for r in ranks])
    for rank, others in zip(ranks, others_own, strict=True):
        step = rank.stats.step.mean_s
        if others is not None and rank.own_s is not None and step:
            excess = (rank.own_s - others) / step
            if excess > STRAGGLER_WAIT_WARN_FRAC:
                slow.append((rank, excess))
    masked = None if slow else masked_outside_work(ranks)
    slow = slow or ([masked] if masked is not None else [])
    if not slow or len(slow) > len(ranks) // 2:  # a straggler is a minority: else there is no typical rank
        return None
    worst, excess = max(slow, key=lambda pair: pair[1])
    ids = sorted(r.rank for r, _ in slow)
    waiting = [r for r in ranks if r.rank not in ids]
    others_exposed = median([r.stats.phases.exposed_comm_frac or 0.0 for r in waiting]) or 0.0
    wait_frac = max(others_exposed - (worst.stats.phases.exposed_comm_frac or 0.0), 0.0)
    others_se = median([r.stats.phases.exposed_comm_frac_se or 0.0 for r in waiting])
    errors = [worst.stats.phases.exposed_comm_frac_se, others_se]
    se = None if None in errors else sum(e * e for e in errors if e is not None) ** 0.5
    return Straggling(ids, worst, excess, waiting, wait_frac, se, masked is not None)


def straggler_title(
    slow: Straggling,
    phase: SlowPhase,
    place: Place | None,
    severity: str | None,
    pattern: SlowestRanks | None,
    where: WaitedIn | None = None,
) -> str:
    """'rank 1 is slow: <excess, phase>; it spends <place>; the others wait for it N% of each step <where>
    <qualifier>'."""
    worst, one = slow.worst, len(slow.ranks) == 1
    who = ranks_text(slow.ranks)
    title = f"{who} is slow: " if one else f"{who} are slow: rank {worst.rank}: "
    title += phase_text(worst, phase)
    if place is not None:
        title += f"; {'it' if one else f'rank {worst.rank}'} spends {place.text()}"
    title += f"; the others wait for it {pct(slow.wait_frac):.0f}% of each step"
    if where is not None:
        title += f", {where.text()}"
    if severity is None and slow.masked:
        title += masking_text(worst, slow.waiting)
    elif severity is None:
        title += f": {too_close_text(slow.wait_frac, slow.se, slow.threshold(severity), worst.stats.steps)}"
    # Last: the clauses above qualify "the others wait for it", which this one would come between.
    return title + chronic_text(pattern, worst.rank, "it" if one else f"rank {worst.rank}")


def straggler_evidence(
    slow: Straggling, phase: SlowPhase, others_share: float, severity: str | None
) -> tuple[Evidence, ...]:
    """Its own time's excess (masked: the outside work's), its slow phase's share, and the others' wait."""
    worst, line = slow.worst, pct(STRAGGLER_WAIT_WARN_FRAC)
    step = worst.stats.step.mean_s or 1e-9
    # Masked, its own time stands out by less than the line; what does stand out is the work the others do not do.
    excess = (
        Evidence("other_excess_pct", pct(phase.excess_s / step), line, "%", rank=worst.rank)
        if slow.masked
        else Evidence("own_time_excess_pct", pct(slow.excess), line, "%", rank=worst.rank)
    )
    waited_line = 0.0 if slow.masked and severity is None else pct(slow.threshold(severity))
    spread = None if slow.se is None else pct(2 * slow.se)
    return (
        excess,
        Evidence(f"{phase.name}_pct", pct(phase.share), pct(others_share), "%", rank=worst.rank),
        Evidence("others_wait_pct", pct(slow.wait_frac), waited_line, "%", spread=spread),
    )


def is_loader_straggler(finding: Finding) -> bool:
    """A straggler finding whose slow rank's time goes to waiting for its own data."""
    return isinstance(finding.details, StragglerDetails) and finding.details.phase == "loader"


def warming_up(findings: list[Finding], run_age_s: float | None) -> list[Finding]:
    """In a live run's first ``STRAGGLER_WARMUP_S`` seconds nothing is said of a rank's speed, not even as info.

    Ranks differ for passing reasons while they start: a newcomer's first screen should not call a
    healthy rank slow.  A report of the whole run (no ``run_age_s``) judges the run as it was.
    """
    if run_age_s is None or run_age_s >= STRAGGLER_WARMUP_S:
        return findings
    return []


def loader_only_straggler_findings(run: RunFigures, ranks_on_host: dict[str, int]) -> list[Finding]:
    """Without DDP's timings: one rank waits for data far longer than the others.

    The others then wait for it inside the all-reduce, about the difference in
    loader share, so that difference is graded like exposed communication.
    """
    ranks = [r for r in measured(run) if r.stats.phases.loader_wait_frac is not None]
    if len(ranks) < 2 or run.world_size <= 1:
        return []
    found: list[tuple[RankFigures, float, float]] = []
    others_loader = leave_one_out_medians([r.stats.phases.loader_wait_frac or 0.0 for r in ranks])
    for rank, others_or_none in zip(ranks, others_loader, strict=True):
        others = others_or_none or 0.0
        mine = rank.stats.phases.loader_wait_frac or 0.0
        if mine - others > STRAGGLER_WAIT_WARN_FRAC:
            found.append((rank, mine - others, others))
    if not found or len(found) > len(ranks) // 2:
        return []
    worst, gap, others = max(found, key=lambda item: item[1])
    severity = grade_above(gap, STRAGGLER_WAIT_WARN_FRAC, STRAGGLER_WAIT_CRITICAL_FRAC)
    if severity is None:
        return []
    threshold = STRAGGLER_WAIT_CRITICAL_FRAC if severity == "critical" else STRAGGLER_WAIT_WARN_FRAC
    share = worst.stats.phases.loader_wait_frac or 0.0
    phase = SlowPhase("loader", share, gap * (worst.stats.step.mean_s or 0.0))
    return [
        Finding(
            cause="straggler",
            severity=severity,
            title=f"rank {worst.rank} is slow: it takes {pct(gap):.0f}% more of each step than the others, "
            f"waiting for its data ({pct(share):.0f}% of its step, the others {pct(others):.0f}%)",
            suggestion=straggler_suggestion(worst, phase, ranks_on_host.get(worst.hello.hostname, 1)),
            evidence=(
                Evidence("loader_wait_pct", pct(share), pct(others), "%", rank=worst.rank),
                Evidence("loader_wait_gap_pct", pct(gap), pct(threshold), "%", rank=worst.rank),
            ),
            ranks=(worst.rank,),
            run_id=run.run_id,
            magnitude=gap,
            cost_s=gap * (worst.stats.step.mean_s or 0.0),
            step_s=worst.stats.step.mean_s,
            waiting_ranks=tuple(r.rank for r in ranks if r is not worst),
            details=StragglerDetails(phase="loader"),
        )
    ]


def straggler_suggestion(rank: RankFigures, phase: SlowPhase, ranks_on_host: int, place: Place | None = None) -> str:
    """The fix for where the excess lies (``slow_work.slow_place``, which the title says too)."""
    who = f"rank {rank.rank}"
    if phase.name == "loader":
        return f"Find why {who}'s input is slower (its data shard, disk, host); then " + loader_suggestion(
            rank, ranks_on_host
        )
    if phase.name in ("forward", "backward") and not rank.on_cuda:
        return (
            f"{who} computes slower than the others on its CPU cores: other processes (this dashboard too, on a "
            "small machine) take CPU time from it, its batches are larger, or its memory pages landed worse "
            "(identical CPU processes can compute 10% apart). Keep other work off the ranks' cores and give "
            "each rank its own (taskset/numactl, torch.set_num_threads); THP_MEM_ALLOC_ENABLE=1 gives PyTorch's "
            "CPU tensors huge pages, which evens ranks out."
        )
    if phase.name in ("forward", "backward"):
        return (
            f"{who} computes slower than the others: check its GPU (clocks, thermal throttling, other processes "
            "on it) and whether its batches are larger or longer (uneven sequence lengths across ranks)."
        )
    if phase.name == "other" and place is not None:
        return (
            f"{who} does extra work each step outside the model that the others do not, {place.where()}: move it "
            "off the step (every N steps, after the loop, or on a thread of its own) or spread it across the ranks."
        )
    if phase.name == "other":
        return (
            f"{who} does extra work each step outside the model (logging, metrics, checkpointing or evaluation "
            "on one rank only): move it off the step or spread it across ranks."
        )
    declared = next((p.slow_fix for p in OWN_PHASES if p.name == phase.name and p.slow_fix), None)
    if declared is not None:
        return declared.format(who=who)
    return f"Compare {who}'s host and device with the others': it takes longer for the same work."
