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

from collections.abc import Callable
from dataclasses import dataclass

from gputop.combine import OWN_PHASES
from gputop.diagnose.findings import Evidence, Finding
from gputop.diagnose.grading import doc_anchor, grade_above, grade_band, measured
from gputop.diagnose.rules.data_loading import loader_suggestion
from gputop.diagnose.rules.rotating import chronic_text, rotating_findings, step_pattern
from gputop.diagnose.thresholds import (
    STRAGGLER_WAIT_CRITICAL_FRAC,
    STRAGGLER_WAIT_WARN_FRAC,
    STRAGGLER_WARMUP_S,
)
from gputop.diagnose.wording import pct, ranks_text, too_close_text
from gputop.model.figures import RankFigures, RunFigures, stat_reader
from gputop.model.frames import FrameShare, RankFrames, span_frames
from gputop.model.statistics import leave_one_out_medians, median
from gputop.protocol import MAX_STACKS_TOP

# The phases a slow rank can lose time in (gputop.combine.OWN_PHASES, and "other", the rest of its step);
# "own" is its own time as a whole, when no one phase holds the excess.
SlowPhaseName = str


PHASES: dict[SlowPhaseName, Callable[[RankFigures], float | None]] = {
    **{p.name: stat_reader(p.seconds) for p in OWN_PHASES},
    "other": lambda r: r.stats.other_s,
}
# Where a slow rank's excess lies, after "it takes N% more of each step than the others, ".
PHASE_WHERE: dict[SlowPhaseName, str] = {
    **{p.name: "in its " + p.label.removesuffix(" takes") for p in OWN_PHASES},
    "loader": "waiting for its data",
    "other": "outside {phases} and comm",
    "own": "spread over its phases, in no one of them",
}


def phase_text(rank: RankFigures, phase: SlowPhase) -> str:
    """The excess first, then where it lies: "it takes 29% more of each step than the others, in its backward pass".

    "outside" lists the phases the rank measures (an unmeasured optimizer's time is in it).
    """
    measured = [p.name for p in OWN_PHASES if not p.optional or getattr(rank.stats, p.seconds) is not None]
    excess = pct(phase.excess_s / (rank.stats.step_time_mean_s or 1e-9))
    where = PHASE_WHERE[phase.name].format(phases=", ".join(measured))
    return f"it takes {excess:.0f}% more of each step than the others, {where}"


# Where the samples put a slow rank's time outside the phases is named when they find there, beyond what
# they find of the others' there, at least this part of what its measured outside time exceeds theirs by.
# Two estimates of one quantity: the samples undercount pure Python (the GIL hands them over at its
# switch points), 0.6-0.9 of the measured time in the benchmark's metric case; a rank descheduled
# between phases shows measured time there and no samples at all (0).
STRAGGLER_PLACE_MIN_PART = 0.5
# Places a title lists, most sampled first, each with at least this part of the first one's samples.
PLACES_NAMED = 3
PLACE_MIN_OF_FIRST = 0.2


@dataclass(frozen=True)
class SlowPhase:
    """The phase in which a slow rank loses most time against the others."""

    name: SlowPhaseName
    share: float  # of the slow rank's step time
    excess_s: float  # per step, over the other ranks' median for the same phase


def straggler_findings(run: RunFigures, ranks_on_host: dict[str, int], run_age_s: float | None = None) -> list[Finding]:
    """Ranks whose own time stands out while the others wait for them in communication.

    ``run_age_s``: how long the run has been seen, when the figures are a live
    span; under ``STRAGGLER_WARMUP_S`` nothing is said of a rank's speed (``warming_up``).
    """
    # Step by step, which rank the others waited for: a rotation blames no one rank, whatever the means say.
    pattern = step_pattern(measured(run)) if run.world_size > 1 else None
    if pattern is not None and pattern.rotates:
        return warming_up(rotating_findings(run, pattern), run_age_s)
    ranks = [r for r in measured(run) if r.own_s is not None and r.stats.exposed_comm_frac is not None]
    if len(ranks) < 2:
        return warming_up(loader_only_straggler_findings(run, ranks_on_host), run_age_s)
    slow: list[tuple[RankFigures, float]] = []  # (rank, its own-time excess as a share of its step)
    others_own = leave_one_out_medians([r.own_s or 0.0 for r in ranks])
    for rank, others in zip(ranks, others_own, strict=True):
        step = rank.stats.step_time_mean_s
        if others is not None and rank.own_s is not None and step:
            excess = (rank.own_s - others) / step
            if excess > STRAGGLER_WAIT_WARN_FRAC:
                slow.append((rank, excess))
    masked = None if slow else masked_outside_work(ranks)
    if masked is not None:
        slow = [masked]
    # A straggler is a minority; when most ranks are "slow" there is no typical rank to compare with.
    if not slow or len(slow) > len(ranks) // 2:
        return []
    slow_ids = {r.rank for r, _ in slow}
    waiting = [r for r in ranks if r.rank not in slow_ids]
    worst, excess = max(slow, key=lambda pair: pair[1])
    # The slow rank arrives last at the all-reduce, so its own exposed comm is the
    # exchange's base cost, which every rank pays (communication's business).  What
    # the others wait beyond that base is what the straggler costs them.
    others_exposed = median([r.stats.exposed_comm_frac or 0.0 for r in waiting]) or 0.0
    wait_frac = max(others_exposed - (worst.stats.exposed_comm_frac or 0.0), 0.0)
    # A difference of two shares: its error is theirs combined (the waiting ranks' typical one).
    errors = [worst.stats.exposed_comm_frac_se, median([r.stats.exposed_comm_frac_se or 0.0 for r in waiting])]
    se = None if None in errors else sum(e * e for e in errors if e is not None) ** 0.5
    severity, close = grade_band(wait_frac, se, STRAGGLER_WAIT_WARN_FRAC, STRAGGLER_WAIT_CRITICAL_FRAC)
    if severity is None and not close and (masked is None or wait_frac <= 0):
        return []

    phase, others_share = slow_phase(worst, waiting)
    threshold = STRAGGLER_WAIT_CRITICAL_FRAC if severity == "critical" else STRAGGLER_WAIT_WARN_FRAC
    who = ranks_text(sorted(slow_ids))
    title = (
        f"{who} {'is' if len(slow_ids) == 1 else 'are'} slow: rank {worst.rank}: "
        if len(slow_ids) > 1
        else f"{who} is slow: "
    )
    title += phase_text(worst, phase)
    frames = span_frames(worst)
    place = straggler_place(phase, worst, waiting)
    # Hidden work is named only where the stacks show it: a place in the user's code outside the model.
    # Outside time that is merely longer (a rank descheduled between phases on a crowded CPU) has none.
    if masked is not None and (phase.name != "other" or place is None):
        return []
    if place is not None:
        who_spends = "it" if len(slow_ids) == 1 else f"rank {worst.rank}"
        title += f"; {who_spends} spends {place.text()}"
    title += f"; the others wait for it {pct(wait_frac):.0f}% of each step"
    if masked is not None and severity is None:
        title += masking_text(worst, waiting)
    elif severity is None:
        title += f": {too_close_text(wait_frac, se, threshold, worst.stats.steps)}"
    # Last: the clauses above qualify "the others wait for it", which this one would come between.
    title += chronic_text(pattern, worst.rank, "it" if len(slow_ids) == 1 else f"rank {worst.rank}")
    # Masked, its own time stands out by less than the line; what does stand out is the work the others do not do.
    excess_evidence = (
        Evidence("own_time_excess_pct", pct(excess), pct(STRAGGLER_WAIT_WARN_FRAC), "%", rank=worst.rank)
        if masked is None
        else Evidence(
            "other_excess_pct",
            pct(phase.excess_s / (worst.stats.step_time_mean_s or 1e-9)),
            pct(STRAGGLER_WAIT_WARN_FRAC),
            "%",
            rank=worst.rank,
        )
    )
    evidence = (
        excess_evidence,
        Evidence(f"{phase.name}_pct", pct(phase.share), pct(others_share), "%", rank=worst.rank),
        Evidence(
            "others_wait_pct",
            pct(wait_frac),
            0.0 if masked is not None and severity is None else pct(threshold),
            "%",
            spread=None if se is None else pct(2 * se),
        ),
    )
    finding = Finding(
        cause="straggler",
        severity=severity or "info",
        title=title,
        suggestion=straggler_suggestion(worst, phase, ranks_on_host.get(worst.hello.hostname, 1)),
        evidence=evidence,
        ranks=tuple(sorted(slow_ids)),
        run_id=run.run_id,
        doc=doc_anchor("straggler"),
        magnitude=wait_frac,
        cost_s=wait_frac * (worst.stats.step_time_mean_s or 0.0),  # what every other rank waits each step
        step_s=worst.stats.step_time_mean_s,
        extra={
            "phase": phase.name,
            "waiting_ranks": [r.rank for r in waiting],
            "frames": {} if frames is None else {worst.rank: frames.to_dict()},
            "slowest": None if pattern is None else pattern.to_dict(),
        },
    )
    return warming_up([finding], run_age_s)


def masked_outside_work(ranks: list[RankFigures]) -> tuple[RankFigures, float] | None:
    """The one rank doing work outside the model that the others do not, while its own time stands out little.

    Every rank runs the same script, so time outside loader, forward, backward
    and comm (metrics, logging, checkpoints) is alike across ranks unless one
    rank does extra work.  When the others' own work is slower too (a neighbour
    takes their CPU, their pages landed worse), it hides that work: the others
    wait for it less than it takes, and its own-time excess stays under the
    line, yet it is still on the step's critical path.  The caller names it
    only where the stacks place that work in the user's code.  Returns the rank with
    its own-time excess, when exactly one rank's outside time exceeds the
    others' median by the line and its own work still takes longer than theirs.
    """
    others_other = leave_one_out_medians([r.stats.other_s or 0.0 for r in ranks])
    others_own = leave_one_out_medians([r.own_s or 0.0 for r in ranks])
    found: list[tuple[RankFigures, float]] = []
    for rank, other, own in zip(ranks, others_other, others_own, strict=True):
        step = rank.stats.step_time_mean_s
        if rank.stats.other_s is None or other is None or own is None or not step:
            continue
        if (rank.stats.other_s - other) / step > STRAGGLER_WAIT_WARN_FRAC and (rank.own_s or 0.0) > own:
            found.append((rank, ((rank.own_s or 0.0) - own) / step))
    return found[0] if len(found) == 1 else None


def masking_text(slow: RankFigures, others: list[RankFigures]) -> str:
    """', less than that work: their own backward pass takes 14 ms more' — why the others wait less than it works."""
    surplus: dict[SlowPhaseName, float] = {}
    for name in (p.name for p in OWN_PHASES):
        mine = PHASES[name](slow)
        typical = median([v for v in (PHASES[name](r) for r in others) if v is not None])
        if mine is not None and typical is not None:
            surplus[name] = typical - mine
    if not surplus or max(surplus.values()) <= 0:
        return ", less than that work: their own work takes longer too"
    name = max(surplus, key=lambda n: surplus[n])
    what = next(p.label for p in OWN_PHASES if p.name == name)
    return (
        f", less than that work: their {what} {surplus[name] * 1e3:.0f} ms more than its, which hides it "
        "(it will cost more once they are faster)"
    )


@dataclass(frozen=True)
class Place:
    """Where the samples put a slow rank's time outside the phases: its places in the user's code."""

    places: tuple[FrameShare, ...]  # most sampled first

    def text(self) -> str:
        """ "38% of each step in `compute_metrics` (train.py:57), after the optimizer step", or several places.

        The few places that hold most of it: a stray sample elsewhere is not a place.
        """
        first = self.places[0].share
        named = [p for p in self.places[:PLACES_NAMED] if p.share >= PLACE_MIN_OF_FIRST * first]
        head = f"{pct(sum(p.share for p in named)):.0f}% of each step"
        if len(named) == 1:
            return f"{head} {named[0].frame.text()}"
        wheres = {p.frame.where for p in named}
        if len(wheres) == 1:
            return f"{head} {named[0].frame.where_text}: " + ", ".join(
                f"{pct(p.share):.0f}% in {p.frame.place}" for p in named
            )
        return f"{head} outside the model: " + ", ".join(p.text() for p in named)


def straggler_place(phase: SlowPhase, slow: RankFigures, others: list[RankFigures]) -> Place | None:
    """For time outside the phases: the user's code the samples find it in, when they find enough of it there.

    The amount is the measured one (``phase.excess_s``); the samples only say
    where it goes.  A place is named when this rank's samples find its
    outside places, beyond the others' samples there, in at least
    ``STRAGGLER_PLACE_MIN_PART`` of that amount.  No one place is asked to
    hold it: a sample names the innermost function of the user's code, so a
    metric's time splits between ``Metric.update``, a generator expression in
    it and the loop that calls it, each a part of the same work.  So every
    place the stacks messages named counts, not only the few a screen shows.
    """
    if phase.name not in ("other", "own"):
        return None
    frames = span_frames(slow, top=MAX_STACKS_TOP)
    places = () if frames is None else frames.outside_phases()
    if not places:
        return None
    theirs = median([outside_share(span_frames(r, top=MAX_STACKS_TOP)) for r in others])
    amount = phase.excess_s / (slow.stats.step_time_mean_s or 1e-9)
    if outside_share(frames) - (theirs or 0.0) < STRAGGLER_PLACE_MIN_PART * amount:
        return None
    return Place(places)


def outside_share(frames: RankFrames | None) -> float:
    """The share of a rank's samples in the user's code outside the phases (0 when it sends no stacks)."""
    return 0.0 if frames is None else sum(p.share for p in frames.outside_phases())


def warming_up(findings: list[Finding], run_age_s: float | None) -> list[Finding]:
    """In a live run's first ``STRAGGLER_WARMUP_S`` seconds nothing is said of a rank's speed, not even as info.

    Ranks differ for passing reasons while they start: a newcomer's first screen should not call a
    healthy rank slow.  A report of the whole run (no ``run_age_s``) judges the run as it was.
    """
    if run_age_s is None or run_age_s >= STRAGGLER_WARMUP_S:
        return findings
    return []


# A phase is named as where a slow rank's time goes when its measured excess is at least this part of the
# rank's whole own-time excess; else the excess is spread over phases, or lies where none is measured.
SLOW_PHASE_MIN_PART = 0.5


def slow_phase(slow: RankFigures, others: list[RankFigures]) -> tuple[SlowPhase, float]:
    """The phase where the slow rank spends most time beyond the others' median, when it holds most of the excess.

    Returns it with the others' median share of step time in that same phase.
    A phase is named only from its own measured time, never because the others
    are not: a forward pass 0.3 ms longer is not where a 20-ms excess went.
    """
    step = slow.stats.step_time_mean_s or 1e-9
    own = slow.own_s or 0.0
    typical_own = median([r.own_s or 0.0 for r in others]) or 0.0
    best: SlowPhase | None = None
    best_typical = 0.0
    for name, read in PHASES.items():
        mine = read(slow)
        typical = median([v for v in (read(r) for r in others) if v is not None])
        if mine is None or typical is None:
            continue
        excess = mine - typical
        if best is None or excess > best.excess_s:
            best, best_typical = SlowPhase(name, mine / step, excess), typical
    if best is None or best.excess_s <= 0 or best.excess_s < SLOW_PHASE_MIN_PART * (own - typical_own):
        return SlowPhase("own", own / step, own - typical_own), typical_own / step
    return best, best_typical / step


def loader_only_straggler_findings(run: RunFigures, ranks_on_host: dict[str, int]) -> list[Finding]:
    """Without DDP's timings: one rank waits for data far longer than the others.

    The others then wait for it inside the all-reduce, about the difference in
    loader share, so that difference is graded like exposed communication.
    """
    ranks = [r for r in measured(run) if r.stats.loader_wait_frac is not None]
    if len(ranks) < 2 or run.world_size <= 1:
        return []
    found: list[tuple[RankFigures, float, float]] = []
    others_loader = leave_one_out_medians([r.stats.loader_wait_frac or 0.0 for r in ranks])
    for rank, others_or_none in zip(ranks, others_loader, strict=True):
        others = others_or_none or 0.0
        mine = rank.stats.loader_wait_frac or 0.0
        if mine - others > STRAGGLER_WAIT_WARN_FRAC:
            found.append((rank, mine - others, others))
    if not found or len(found) > len(ranks) // 2:
        return []
    worst, gap, others = max(found, key=lambda item: item[1])
    severity = grade_above(gap, STRAGGLER_WAIT_WARN_FRAC, STRAGGLER_WAIT_CRITICAL_FRAC)
    if severity is None:
        return []
    threshold = STRAGGLER_WAIT_CRITICAL_FRAC if severity == "critical" else STRAGGLER_WAIT_WARN_FRAC
    share = worst.stats.loader_wait_frac or 0.0
    phase = SlowPhase("loader", share, gap * (worst.stats.step_time_mean_s or 0.0))
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
            doc=doc_anchor("straggler"),
            magnitude=gap,
            cost_s=gap * (worst.stats.step_time_mean_s or 0.0),
            step_s=worst.stats.step_time_mean_s,
            extra={"phase": "loader", "waiting_ranks": [r.rank for r in ranks if r is not worst]},
        )
    ]


def straggler_suggestion(rank: RankFigures, phase: SlowPhase, ranks_on_host: int) -> str:
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
    if phase.name == "other":
        return (
            f"{who} does extra work each step outside the model (logging, metrics, checkpointing or evaluation "
            "on one rank only): move it off the step or spread it across ranks."
        )
    declared = next((p.slow_fix for p in OWN_PHASES if p.name == phase.name and p.slow_fix), None)
    if declared is not None:
        return declared.format(who=who)
    return f"Compare {who}'s host and device with the others': it takes longer for the same work."
