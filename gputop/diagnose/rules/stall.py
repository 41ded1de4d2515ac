"""stall: a rank stops now and then (a checkpoint save, an evaluation pass, a GC pause, a slow batch).

Read from per-step data, not from means: the run's step-time sketch counts the
steps of at least ``STALL_FACTOR`` x the median and the time they lose, and
each window's slowest steps say whether that time went to waiting for a batch.
In synchronous DDP every rank sees the long step; the one that stopped is the
one that did not spend it waiting in the all-reduce, or, where stacks are
sampled, in a collective of the user's own (``dist.all_reduce(loss)``, a barrier).

A stall raises means too, so the exposed comm of the ranks that waited, a
straggler's own time or the loader share can cross their lines because of it.
Those are the stall's symptoms (``stall_explains``, a row of
``gputop.diagnose.symptoms``) when what is left of them without the stall's
share is below their warn line.

Where the reporter samples the training thread's stack, a stall outside the
loader names the place in the user's code that took the stopping rank's time
("in `write_snapshot` (train.py:88), after the optimizer step"), when that
place holds at least half the stall's share of the samples.
"""

from __future__ import annotations

from gputop.diagnose.details import StallDetails
from gputop.diagnose.findings import Cause, Evidence, Finding
from gputop.diagnose.grading import grade_above, measured
from gputop.diagnose.rules.recompile import stall_beyond_compiles
from gputop.diagnose.thresholds import (
    EXPOSED_COMM_WARN_FRAC,
    LOADER_WAIT_WARN_FRAC,
    STALL_CRITICAL_FRAC,
    STALL_IN_COMM_FRAC,
    STALL_LOADER_FRAC,
    STALL_MIN_COUNT,
    STALL_MIN_STOP_S,
    STALL_WARN_FRAC,
    STRAGGLER_WAIT_WARN_FRAC,
)
from gputop.diagnose.wording import pct, ranks_text
from gputop.model.figures import RankFigures, RunFigures
from gputop.model.frames import OUTSIDE_PHASES, FrameShare, RankFrames, span_frames
from gputop.model.stalls import STALL_FACTOR

# Each symptom's own warn line: what is left of it without the stall must stay under it.
# A sampled place names a stall when it holds at least this part of the stall's share of the time.
STALL_PLACE_MIN_PART = 0.5
# Where a stall outside the loader can be: the user's code between the phases, or the optimizer's step.
STALL_PLACES = OUTSIDE_PHASES | {"optimizer"}

SYMPTOM_WARN_FRAC: dict[Cause, float] = {
    "communication": EXPOSED_COMM_WARN_FRAC,
    "straggler": STRAGGLER_WAIT_WARN_FRAC,
    "data_loading": LOADER_WAIT_WARN_FRAC,
}


def stall_findings(run: RunFigures) -> list[Finding]:
    """One finding per run whose ranks lose a share of their time to occasional long steps."""
    # Steps that turned slow and stayed so are a new level, the business of the phase that grew (the loader's,
    # usually), not stops now and then: as a stall it would hold that phase's finding as its symptom.
    # A compile (torch.compile's first, or a recompile) is a long step too, and its rule's business: only what
    # compiling leaves of the stalls counts (stall_beyond_compiles; the same figures where nothing compiled).
    # A stop jitter can make (a lost time slice) is no stall, however often.
    stalled = [
        r
        for r in measured(run)
        if stall_beyond_compiles(r.stats)[0] >= STALL_MIN_COUNT
        and stall_beyond_compiles(r.stats)[1]
        and stop_s(r) >= STALL_MIN_STOP_S
        and not r.stats.stalls.level_shift
    ]
    if not stalled:
        return []
    frac = max(stall_beyond_compiles(r.stats)[1] for r in stalled)
    severity = grade_above(frac, STALL_WARN_FRAC, STALL_CRITICAL_FRAC)
    if severity is None:
        return []
    # The ranks that stopped: those whose stall time was not spent waiting for another, in DDP's all-reduce
    # (timed) or in a collective of the user's own (a loss all-reduce, a barrier: seen in the stack samples).
    in_collective = {r.rank: collective_wait(r, r.stats.stalls.frac or 0.0) for r in stalled}
    stoppers = [
        r
        for r in stalled
        if (r.stats.stalls.in_comm_frac or 0.0) < STALL_IN_COMM_FRAC and in_collective[r.rank] is None
    ]
    named = stoppers or stalled
    main = max(named, key=lambda r: stall_beyond_compiles(r.stats)[1])
    stats = main.stats
    loader = (stats.stalls.loader_frac or 0.0) >= STALL_LOADER_FRAC
    frames = span_frames(main)
    waiting = [r for r in stalled if r not in named]
    threshold = STALL_CRITICAL_FRAC if severity == "critical" else STALL_WARN_FRAC
    return [
        Finding(
            cause="stall",
            severity=severity,
            title=stall_title(named, main, loader, frames, waiting, in_collective),
            suggestion=stall_suggestion(main, loader=loader),
            evidence=stall_evidence(main, threshold),
            ranks=tuple(sorted(r.rank for r in named)),
            run_id=run.run_id,
            magnitude=frac,
            cost_s=frac * (stats.step.mean_s or 0.0),  # each stall's excess, spread over the steps
            step_s=stats.step.mean_s,
            waiting_ranks=tuple(r.rank for r in waiting),
            frames=() if frames is None else (frames,),
            details=StallDetails(in_loader=loader, period_steps=stats.stalls.period_steps),
        )
    ]


def stop_s(rank: RankFigures) -> float:
    """How long a rank stops at each stall: its stall steps' mean less its usual (median) step, not the whole
    step the stop sits in (0 without stalls)."""
    stalls = rank.stats.stalls
    return max((stalls.mean_s or 0.0) - (rank.stats.step.p50_s or 0.0), 0.0) if stalls.mean_s else 0.0


def stall_evidence(main: RankFigures, threshold: float) -> tuple[Evidence, ...]:
    """The stopping rank's share of the run lost, its stops' length against the line, and how much was loading."""
    stats = main.stats
    in_loader = stats.stalls.loader_frac
    evidence = (
        Evidence("stall_pct", pct(stall_beyond_compiles(stats)[1]), pct(threshold), "%", rank=main.rank),
        Evidence("stall_ms", 1e3 * (stats.stalls.mean_s or 0.0), 1e3 * STALL_FACTOR * (stats.step.p50_s or 0.0),
                 "ms", op=">=", rank=main.rank),
    )  # fmt: skip
    if in_loader is None:
        return evidence
    return (*evidence, Evidence("stall_in_loader_pct", pct(in_loader), pct(STALL_LOADER_FRAC), "%", op="vs"))


def stall_title(
    named: list[RankFigures],
    main: RankFigures,
    loader: bool,
    frames: RankFrames | None,
    waiting: list[RankFigures],
    in_collective: dict[int, FrameShare | None],
) -> str:
    """'rank 0 stops 418 ms every 10 steps (14 of 150): 9% of the run, outside the loader, in `save` (train.py:88);
    rank 1 waits for it in the all-reduce'; the stop is the stall steps' time beyond a usual step (``stop_s``)."""
    stats = main.stats
    count, main_frac = stall_beyond_compiles(stats)
    title = (
        f"{ranks_text([r.rank for r in named])} {'stops' if len(named) == 1 else 'stop'} "
        f"{1e3 * stop_s(main):.0f} ms {when_text(stats.stalls.period_steps, stats.stalls.regular)} "
        f"({count or 1} of {stats.steps}): {pct(main_frac):.0f}% of the run"
    )
    title += ", waiting for a batch" if loader else ", outside the loader"
    place = None if loader or frames is None else stall_place(frames, stats.stalls.frac or 0.0)
    if place is not None:
        title += f", {place.frame.text()}"
    in_ddp = [r.rank for r in waiting if in_collective[r.rank] is None]
    if in_ddp:
        title += f"; {ranks_text(in_ddp)} {'waits' if len(in_ddp) == 1 else 'wait'} for it in the all-reduce"
    for rank in waiting:
        where = in_collective[rank.rank]
        if where is not None:
            title += f"; rank {rank.rank} waits for it {where.frame.text()}"
    return title


def stall_place(frames: RankFrames, stall_frac: float) -> FrameShare | None:
    """The sampled place in the user's code that plausibly holds the stall: the top one outside the model's phases."""
    place = next((f for f in frames.top if f.frame.where in STALL_PLACES and f.frame.file), None)
    if place is None or place.share < STALL_PLACE_MIN_PART * stall_frac:
        return None
    return place


def collective_wait(rank: RankFigures, stall_frac: float) -> FrameShare | None:
    """The collective outside DDP a rank's stalls were spent in (its samples' top one), if it holds half of them.

    A rank that waits for a stopped one in ``dist.all_reduce(loss)`` or a
    barrier stalls as long, outside DDP's timed exchange: only where its
    training thread was tells it from the rank that stopped.
    """
    frames = span_frames(rank)
    if frames is None:
        return None
    waits = [f for f in frames.top if f.frame.where == "collective"]
    if not waits or sum(f.share for f in waits) < STALL_PLACE_MIN_PART * stall_frac:
        return None
    return waits[0]


def when_text(period_steps: int | None, regular: bool | None) -> str:
    """ "every 10 steps" from the stall steps' numbers, "at irregular intervals", or "now and then" (too few to say)."""
    if period_steps is not None:
        return f"every {period_steps} steps"
    return "at irregular intervals" if regular is False else "now and then"


def stall_suggestion(rank: RankFigures, *, loader: bool) -> str:
    if loader:
        return (
            f"Rank {rank.rank} waits for a batch now and then: DataLoader(persistent_workers=True) if it happens "
            "at each epoch's start (workers restart), a larger prefetch_factor to ride out slow batches, and look "
            "for slow samples (large files, remote reads) or a worker that dies."
        )
    when = when_text(rank.stats.stalls.period_steps, rank.stats.stalls.regular)
    return (
        f"Rank {rank.rank} stops outside the loader {when}: a checkpoint save, an "
        "evaluation pass, logging or a GC pause. Save checkpoints asynchronously "
        "(torch.distributed.checkpoint.async_save) or less often, evaluate less often or on all ranks at once, "
        "and try gc.freeze() after start-up."
    )


def stall_explains(stall: Finding, finding: Finding) -> bool:
    """A finding of a ``SYMPTOM_WARN_FRAC`` cause in the stall's run, under its line without the stall's share."""
    return (
        finding.run_id == stall.run_id
        and finding.severity != "info"
        and finding.magnitude - stall.magnitude <= SYMPTOM_WARN_FRAC[finding.cause]
    )
