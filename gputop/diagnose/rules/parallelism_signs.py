"""The signs of too little work per step (gputop/diagnose/rules/parallelism.py reads them into one finding).

Each sign fires only where its numbers are measured, and carries its evidence, severity, magnitude and
ranks (``Sign``): signs 1-4 read the step's time (an idle GPU, a GPU step short of the wall step, tiny
steps, an exchange large only next to a short step), 5 and 6 its work (small kernels on a busy GPU, little
work at a small batch: issue #46).  Why each is what it is: parallelism.py's docstring and
docs/diagnosis.md#parallelism-too-little-work-per-step.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputop.diagnose.findings import Evidence, Severity
from gputop.diagnose.grading import grade_above, grade_below
from gputop.diagnose.rules.rotating import step_pattern
from gputop.diagnose.thresholds import (
    EXPOSED_COMM_CRITICAL_FRAC,
    EXPOSED_COMM_WARN_FRAC,
    GPU_STEP_OVER_WALL_STEP_RATIO,
    GPU_UTIL_BUSY_PCT,
    GPU_UTIL_LOW_CRITICAL_PCT,
    GPU_UTIL_LOW_WARN_PCT,
    LOADER_WAIT_WARN_FRAC,
    MAIN_THREAD_BUSY_PCT,
    SMALL_BATCH_SIZE,
    TINY_STEP_CRITICAL_S,
    TINY_STEP_WARN_S,
    WORK_LITTLE_MFU,
)
from gputop.diagnose.wording import pct
from gputop.model.figures import RankFigures
from gputop.model.statistics import median

# The batch the fix suggests, as a multiple of today's: the exchange's share is projected at it (parallelism.py).
BATCH_GROWTH = 4


def waits_are_low(rank: RankFigures) -> bool:
    """Loader and exposed-comm shares both measured and under their lines (N/A is not low)."""
    loader, comm = rank.stats.phases.loader_wait_frac, rank.stats.phases.exposed_comm_frac
    if comm is None and rank.hello.world_size <= 1:
        comm = 0.0  # a world of one rank exchanges no gradients: nothing to wait for
    return (
        loader is not None and comm is not None and loader <= LOADER_WAIT_WARN_FRAC and comm <= EXPOSED_COMM_WARN_FRAC
    )


def steady_step_s(rank: RankFigures) -> float:
    """The mean step without the stalls' excess: what a step costs when nothing stops it.

    The mean, not the histogram's p50: fixed per-step cost is about the average
    step.  But not the plain mean either: on a crowded machine a tiny step is
    now and then descheduled for tens of milliseconds, and those stalls (named
    by their own finding) would lift the mean of 2-ms steps over the 10-ms line.
    """
    return (rank.stats.step.mean_s or 0.0) * (1.0 - (rank.stats.stalls.frac or 0.0))


def exchange_shares(rank: RankFigures) -> tuple[float, float] | None:
    """(the exposed exchange's share of the step now, its share at BATCH_GROWTH x the batch); None unmeasured."""
    stats = rank.stats
    step = steady_step_s(rank)
    exposed, forward, backward = stats.phases.exposed_comm_s, stats.phases.forward_s, stats.phases.backward_s
    if step <= 0 or exposed is None or forward is None or backward is None:
        return None
    grown = step + (BATCH_GROWTH - 1) * (forward + backward)
    return exposed / step, exposed / grown


def without_waits_for_the_slowest(
    ranks: list[RankFigures], shares: dict[int, tuple[float, float]]
) -> dict[int, tuple[float, float]]:
    """Each rank's exchange shares (now, grown) less its wait, step by step, for that step's slowest rank."""
    pattern = step_pattern(ranks)
    if pattern is None:
        return shares
    out = {}
    for rank in ranks:
        if rank.rank not in shares:
            continue
        now, grown = shares[rank.rank]
        step = steady_step_s(rank)
        waited = pattern.waited_by_rank.get(rank.rank, 0.0) / step if step > 0 else 0.0
        left = max(now - waited, 0.0)
        out[rank.rank] = (left, grown * left / now if now > 0 else 0.0)
    return out


def small_batch(rank: RankFigures) -> bool:
    batch = rank.hello.loader_batch_size
    return batch is not None and batch <= SMALL_BATCH_SIZE and rank.stats.step.mean_s is not None


def compute_mfu(rank: RankFigures) -> float | None:
    """The MFU of the rank's steps while they compute: its MFU over the share of the step no other cause takes
    (the loader's wait, the exposed exchange, stalls, the wait for a CPU).  None where the work or the peak is
    not known (docs/mfu.md).  A step that waits half its time for data and computes at 30% of the peak the
    other half does its device's worth of work when it works."""
    mfu = rank.mfu
    if mfu is None:
        return None
    s = rank.stats
    taken = (s.phases.loader_wait_frac or 0.0) + (s.phases.exposed_comm_frac or 0.0) + (s.stalls.frac or 0.0)
    taken += s.cpu.main_wait_frac or 0.0
    return mfu / max(1.0 - taken, 0.05)


def little_work_evidence(ranks: list[RankFigures]) -> Evidence:
    """The rank whose compute reaches the least of its device's peak, as evidence of how little work a step is."""
    mfu, least = min(((x, r.rank) for r in ranks if (x := compute_mfu(r)) is not None), key=lambda w: w[0])
    return Evidence("mfu_pct", pct(mfu), pct(WORK_LITTLE_MFU), "%", op="<", rank=least)


def little_work_sign(ranks: list[RankFigures]) -> Sign | None:
    """6. At a small batch, every rank's compute reaches under ``WORK_LITTLE_MFU`` of its device's peak, and no
    other cause takes its time (loader wait and exposed exchange under their lines on every rank, so no rank
    waits for another): the step is simply too little work, however long Python makes it (minGPT's example
    at batch 2: 25-30 ms steps at 2.4% of a core's peak, under no other line)."""
    small = [r for r in ranks if small_batch(r)]
    if not small or len(small) != len(ranks) or not all(waits_are_low(r) for r in small):
        return None
    works = [(r, x) for r in small if (x := compute_mfu(r)) is not None]
    if len(works) != len(small) or any(x >= WORK_LITTLE_MFU for _, x in works):
        return None
    least, mfu = min(works, key=lambda item: item[1])
    batch = min(r.hello.loader_batch_size or 0 for r in small)
    evidence = (
        Evidence("mfu_pct", pct(mfu), pct(WORK_LITTLE_MFU), "%", op="<", rank=least.rank),
        Evidence("batch_size", batch, SMALL_BATCH_SIZE, "", op="<="),
    )
    return Sign(evidence, "warn", 1.0 - mfu / WORK_LITTLE_MFU, frozenset(r.rank for r in small))


def small_kernels_sign(ranks: list[RankFigures]) -> Sign | None:
    """5. The GPU's kernels run most of the time (NVML utilization), yet the step's FLOPs reach a small share of
    its peak: the kernels are small, the step launch-bound.  Not where every matmul runs in float32 without
    TF32 or autocast: that is the precision's cost (model_config), not the kernels' size."""
    busy = [
        r
        for r in ranks
        if r.on_cuda
        and r.gpu_util_pct is not None
        and r.gpu_util_pct >= GPU_UTIL_BUSY_PCT
        and (x := compute_mfu(r)) is not None
        and x < WORK_LITTLE_MFU
        and not full_precision_matmuls(r)
    ]
    if not busy:
        return None
    least = min(busy, key=lambda r: compute_mfu(r) or 0.0)
    mfu, util = compute_mfu(least) or 0.0, least.gpu_util_pct or 0.0
    evidence = (
        Evidence("gpu_util_pct", util, GPU_UTIL_BUSY_PCT, "%", op=">=", rank=least.rank),
        Evidence("mfu_pct", pct(mfu), pct(WORK_LITTLE_MFU), "%", op="<", rank=least.rank),
    )
    return Sign(evidence, "warn", 1.0 - mfu / WORK_LITTLE_MFU, frozenset(r.rank for r in busy), launch_bound=True)


def full_precision_matmuls(rank: RankFigures) -> bool:
    """Whether most of the step's counted FLOPs ran in float32 with TF32 off for them (the rank's dtype mix)."""
    mix = rank.hello.flops_mix or {}
    fp32 = sum(share for dtype, share in mix.items() if dtype.startswith("float32"))
    return fp32 > 0.5 and not rank.hello.tf32_matmul and rank.hello.autocast is not True


@dataclass(frozen=True)
class Sign:
    """One sign of too little work per step that fired: what it saw, how bad, on which ranks."""

    evidence: tuple[Evidence, ...]
    severity: Severity
    magnitude: float  # the share of the step it costs, the finding's largest
    ranks: frozenset[int]
    launch_bound: bool = False  # the host cannot issue GPU work faster


def idle_gpu_sign(ranks: list[RankFigures]) -> tuple[Sign | None, float | None]:
    """1. The GPU idles while nothing the tool can see holds it up (torch-tb-profiler's < 50%); and that median
    utilisation.  A main thread pegged at one core is why: the host cannot issue work faster."""
    idle = [r for r in ranks if r.gpu_util_pct is not None and waits_are_low(r)]
    util = median([r.gpu_util_pct or 0.0 for r in idle])
    severity = grade_below(util, GPU_UTIL_LOW_WARN_PCT, GPU_UTIL_LOW_CRITICAL_PCT)
    if severity is None or util is None:
        return None, util
    threshold = GPU_UTIL_LOW_CRITICAL_PCT if severity == "critical" else GPU_UTIL_LOW_WARN_PCT
    evidence = [Evidence("gpu_util_pct", util, threshold, "%", op="<")]
    busy = [r for r in idle if r.on_cuda and (r.stats.cpu.pct or 0.0) >= MAIN_THREAD_BUSY_PCT]
    if busy:
        worst = max(busy, key=lambda r: r.stats.cpu.pct or 0.0)
        cpu = worst.stats.cpu.pct or 0.0
        evidence.append(Evidence("main_cpu_pct", cpu, MAIN_THREAD_BUSY_PCT, "%", op=">=", rank=worst.rank))
    ranks_idle = frozenset(r.rank for r in idle)
    return Sign(tuple(evidence), severity, 1 - util / 100, ranks_idle, launch_bound=bool(busy)), util


def gpu_step_sign(ranks: list[RankFigures]) -> Sign | None:
    """2. The GPU's step is a small part of the wall step: the host is the bottleneck."""
    ratios = [
        (r, r.stats.step.gpu_p50_s / r.stats.step.p50_s)
        for r in ranks
        if r.stats.step.gpu_p50_s is not None and r.stats.step.p50_s and waits_are_low(r)
    ]
    ratio = median([x for _, x in ratios])
    if ratio is None or ratio >= GPU_STEP_OVER_WALL_STEP_RATIO:
        return None
    evidence = (Evidence("gpu_step_over_wall_step", ratio, GPU_STEP_OVER_WALL_STEP_RATIO, "x", op="<"),)
    return Sign(evidence, "warn", 1 - ratio, frozenset(r.rank for r, _ in ratios), launch_bound=True)


def working_step_s(rank: RankFigures) -> float:
    """The steady step less the training thread's wait for a CPU: the step's own work.

    Two ranks that take turns on one core each step twice as long as they work: the wait is allocation's
    (named by its own finding), not more work per step, and a tiny step stays tiny behind it.
    """
    return steady_step_s(rank) * (1.0 - (rank.stats.cpu.main_wait_frac or 0.0))


def tiny_step_sign(ranks: list[RankFigures]) -> tuple[Sign | None, float | None]:
    """3. Tiny steps at a small batch: fixed per-step overhead dominates; and the small-batch ranks' median step
    (its own work: ``working_step_s``).  Below the warn line, the share of the step that is fixed overhead grows
    as the step shrinks."""
    small = [r for r in ranks if small_batch(r)]
    step = median([working_step_s(r) for r in small])
    severity = grade_below(step, TINY_STEP_WARN_S, TINY_STEP_CRITICAL_S)
    if severity is None or step is None or not small:
        return None, step
    threshold = TINY_STEP_CRITICAL_S if severity == "critical" else TINY_STEP_WARN_S
    batch = min(r.hello.loader_batch_size or 0 for r in small)
    evidence = (
        Evidence("step_time_ms", step * 1e3, threshold * 1e3, "ms", op="<"),
        Evidence("batch_size", batch, SMALL_BATCH_SIZE, "", op="<="),
    )
    return Sign(evidence, severity, 1 - step / TINY_STEP_WARN_S, frozenset(r.rank for r in small)), step


def exchange_sign(ranks: list[RankFigures], *, tiny_steps: bool) -> tuple[Sign | None, tuple[int, float, float] | None]:
    """4. At a small batch the exchange is a large share of the step, and would not be with more work per step;
    and (batch, share now, share at the grown batch).  Only where the steps are not tiny already (sign 3).

    The rank that waits least shows the exchange's own cost; the others' waits add the time they spend
    waiting for a slower rank, a straggler's business (more work per step would not shorten it), and where
    the slowest rank changes from step to step (uneven batches) every rank waits in turn: the time each
    waited for the step's slowest, step by step, is taken out first.
    """
    small = [r for r in ranks if small_batch(r)]
    shares = {r.rank: x for r in small if (x := exchange_shares(r)) is not None}
    if shares and min(shares.values())[0] > EXPOSED_COMM_WARN_FRAC:
        shares = without_waits_for_the_slowest(small, shares)
    now, grown = min(shares.values(), default=(None, None))
    if now is None or grown is None or not now > EXPOSED_COMM_WARN_FRAC > grown or tiny_steps:
        return None, None
    batch = min(r.hello.loader_batch_size or 0 for r in small if r.rank in shares)
    least = min(shares, key=lambda rank: shares[rank])
    evidence = (
        Evidence("exposed_comm_pct", pct(now), pct(EXPOSED_COMM_WARN_FRAC), "%", rank=least),
        Evidence(f"exposed_comm_pct_at_batch_{BATCH_GROWTH * batch}", pct(grown), pct(EXPOSED_COMM_WARN_FRAC), "%",
                 op="<", rank=least),
        Evidence("batch_size", batch, SMALL_BATCH_SIZE, "", op="<="),
    )  # fmt: skip
    severity = grade_above(now, EXPOSED_COMM_WARN_FRAC, EXPOSED_COMM_CRITICAL_FRAC) or "warn"
    return Sign(evidence, severity, now - grown, frozenset(shares)), (batch, now, grown)


# What a tiny step's finding adds when it takes in the exchange and straggler findings its steps explain.
