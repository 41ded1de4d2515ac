"""parallelism: too little work per step for the device to stay busy.

Five signs, each only where its numbers are measured: the GPU is mostly idle
although neither the loader nor the gradient exchange holds it up; the GPU is
busy for a small part of each wall step; steps are so short, at a small batch,
that fixed per-step costs (Python, launches, the all-reduce's latency) are most
of them; at a small batch, the gradient exchange is a large share of the
step only because the step does so little work; or the GPU's kernels run most
of the time and the step's FLOPs reach a small share of its peak (small,
launch-bound kernels).  All five call for more work per step.

The work each step does (its counted FLOPs, issue #46) judges them: a step whose
compute reaches ``WORK_ENOUGH_MFU`` of its device's peak, over the time no other
cause takes, does its device's worth of work and is never called short, however
short it is or however large the exchange's share; one under ``WORK_LITTLE_MFU``
has that MFU in the finding's evidence.  Unmeasured (no count, no peak), the
signs speak alone, as before.

The fourth tells a tiny step's symptom from a real communication problem by
what more work per step would do.  The exchange moves the gradients, whose size
does not depend on the batch, so its exposed time stays; forward and backward
grow with the batch.  At ``BATCH_GROWTH`` times the batch (what the fix
suggests) the step is about ``step + (BATCH_GROWTH - 1) x (forward + backward)``
(an upper bound: at a tiny batch compute grows less than the batch does, which
only lowers the projection's step), and the exchange's share of it is
``exposed / that``.  When that share falls under the communication line, the
exchange is a symptom and the cause is too little work per step; when it stays
over it (50 MB of gradients for a few ms of compute), communication is the cause.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gputop.diagnose.details import ParallelismDetails
from gputop.diagnose.findings import SEVERITIES, Evidence, Finding, Severity
from gputop.diagnose.grading import grade_above, grade_below, largest_cost, measured
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
    WORK_ENOUGH_MFU,
    WORK_LITTLE_MFU,
)
from gputop.diagnose.wording import pct, ranks_text
from gputop.model.figures import RankFigures, RunFigures
from gputop.model.statistics import median

# The batch the fix suggests, as a multiple of today's: the exchange's share is projected at it (see above).
BATCH_GROWTH = 4


def waits_are_low(rank: RankFigures) -> bool:
    """Loader and exposed-comm shares both measured and under their lines (N/A is not low)."""
    loader, comm = rank.stats.loader_wait_frac, rank.stats.exposed_comm_frac
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
    return (rank.stats.step_time_mean_s or 0.0) * (1.0 - (rank.stats.stall_frac or 0.0))


def exchange_shares(rank: RankFigures) -> tuple[float, float] | None:
    """(the exposed exchange's share of the step now, its share at BATCH_GROWTH x the batch); None unmeasured."""
    stats = rank.stats
    step = steady_step_s(rank)
    exposed, forward, backward = stats.exposed_comm_s, stats.forward_s, stats.backward_s
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
    return batch is not None and batch <= SMALL_BATCH_SIZE and rank.stats.step_time_mean_s is not None


def parallelism_findings(run: RunFigures, *, exchange_explained: bool = False) -> list[Finding]:
    """At most one finding per run, carrying the evidence of every sign that fired.

    ``exchange_explained``: a setting explains the exposed exchange (``model_config``'s tiny buckets), so the
    exchange is not read as a sign of too little work per step (sign 4).
    """
    ranks = measured(run)
    if not ranks:
        return []
    work = median([x for r in ranks if (x := compute_mfu(r)) is not None])
    if work is not None and work >= WORK_ENOUGH_MFU:
        return []  # the steps do their device's worth of work: whatever else holds them up, it is not that
    idle, util = idle_gpu_sign(ranks)
    tiny, step = tiny_step_sign(ranks)
    exchange, exchange_at = (None, None) if exchange_explained else exchange_sign(ranks, tiny_steps=tiny is not None)
    kernels = small_kernels_sign(ranks)
    signs = [sign for sign in (idle, gpu_step_sign(ranks), tiny, exchange, kernels) if sign]
    # The work alone names the cause where no sign of time does (sign 6): the step is not short, just empty.
    alone = little_work_sign(ranks) if not signs else None
    signs = signs or ([alone] if alone else [])
    if not signs:
        return []
    fired = sorted(set().union(*(sign.ranks for sign in signs)))
    named = {e.metric for sign in signs for e in sign.evidence}
    little = () if work is None or work >= WORK_LITTLE_MFU or "mfu_pct" in named else (little_work_evidence(ranks),)
    return [
        Finding(
            cause="parallelism",
            severity=max((sign.severity for sign in signs), key=SEVERITIES.index),
            title=parallelism_title(
                fired,
                util,
                step,
                exchange_at,
                little_mfu=work if little or alone else None,
                small_kernels=kernels is not None and len(signs) == 1,
                little_work=None if alone is None else int(alone.evidence[1].value),
            ),
            suggestion=parallelism_suggestion(ranks[0], launch_bound=any(sign.launch_bound for sign in signs)),
            evidence=tuple(e for sign in signs for e in sign.evidence) + little,
            ranks=tuple(fired),
            run_id=run.run_id,
            magnitude=max(sign.magnitude for sign in signs),
            # The exchange's finding is this one's symptom where the steps are tiny (tiny_steps_explain).
            details=ParallelismDetails(
                tiny_steps=tiny is not None or exchange is not None, exchange_symptom=exchange is not None
            ),
        )
    ]


def compute_mfu(rank: RankFigures) -> float | None:
    """The MFU of the rank's steps while they compute: its MFU over the share of the step no other cause takes
    (the loader's wait, the exposed exchange, stalls, the wait for a CPU).  None where the work or the peak is
    not known (docs/mfu.md).  A step that waits half its time for data and computes at 30% of the peak the
    other half does its device's worth of work when it works."""
    mfu = rank.mfu
    if mfu is None:
        return None
    s = rank.stats
    taken = (s.loader_wait_frac or 0.0) + (s.exposed_comm_frac or 0.0) + (s.stall_frac or 0.0)
    taken += s.main_cpu_wait_frac or 0.0
    return mfu / max(1.0 - taken, 0.05)


def little_work_evidence(ranks: list[RankFigures]) -> Evidence:
    """The rank whose compute reaches the least of its device's peak, as evidence of how little work a step is."""
    least = min((r for r in ranks if compute_mfu(r) is not None), key=lambda r: compute_mfu(r) or 0.0)
    return Evidence("mfu_pct", pct(compute_mfu(least) or 0.0), pct(WORK_LITTLE_MFU), "%", op="<", rank=least.rank)


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
    busy = [r for r in idle if r.on_cuda and (r.stats.cpu_pct or 0.0) >= MAIN_THREAD_BUSY_PCT]
    if busy:
        worst = max(busy, key=lambda r: r.stats.cpu_pct or 0.0)
        cpu = worst.stats.cpu_pct or 0.0
        evidence.append(Evidence("main_cpu_pct", cpu, MAIN_THREAD_BUSY_PCT, "%", op=">=", rank=worst.rank))
    ranks_idle = frozenset(r.rank for r in idle)
    return Sign(tuple(evidence), severity, 1 - util / 100, ranks_idle, launch_bound=bool(busy)), util


def gpu_step_sign(ranks: list[RankFigures]) -> Sign | None:
    """2. The GPU's step is a small part of the wall step: the host is the bottleneck."""
    ratios = [
        (r, r.stats.gpu_step_time_p50_s / r.stats.step_time_p50_s)
        for r in ranks
        if r.stats.gpu_step_time_p50_s is not None and r.stats.step_time_p50_s and waits_are_low(r)
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
    return steady_step_s(rank) * (1.0 - (rank.stats.main_cpu_wait_frac or 0.0))


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
JITTER_TOO = "; the all-reduce and rank jitter add up to a large share"


def has_tiny_steps(parallelism: Finding) -> bool:
    """A parallelism finding whose steps are tiny (or whose exchange more work would hide): it explains fixed costs."""
    return isinstance(parallelism.details, ParallelismDetails) and parallelism.details.tiny_steps


def tiny_steps_explain(parallelism: Finding, finding: Finding) -> bool:
    """A communication or straggler finding of a tiny-step run: a symptom of too little work per step.

    When steps last a few milliseconds at a small batch, the all-reduce's fixed
    latency and a millisecond of scheduling jitter on one rank are large shares
    of the step, and the fix is the same (more work per step), whatever their
    grade.  Steps short in themselves make every rank's jitter a large share too;
    an exchange that is long only next to a short step says nothing of a slow
    rank, whose finding stays its own.
    """
    if not isinstance(parallelism.details, ParallelismDetails) or finding.run_id != parallelism.run_id:
        return False
    causes = ("communication",) if parallelism.details.exchange_symptom else ("communication", "straggler")
    return finding.cause in causes


def fold_fixed_costs(findings: Sequence[Finding], index: int, symptoms: Sequence[Finding], note: str) -> list[Finding]:
    """The findings with the parallelism finding at ``index`` taking in the fixed costs its tiny steps explain.

    Like ``fold_symptoms``, but the evidence its signs already name is not
    repeated, and its title adds that the all-reduce and rank jitter add up,
    unless only the exchange was its symptom.  The symptoms stay listed, as
    info, with ``note``, so nothing is hidden.
    """
    parallelism = findings[index]
    exchange_only = isinstance(parallelism.details, ParallelismDetails) and parallelism.details.exchange_symptom
    named = {e.metric for e in parallelism.evidence}
    merged = replace(
        parallelism,
        severity=max([parallelism.severity, *(f.severity for f in symptoms)], key=SEVERITIES.index),
        evidence=parallelism.evidence + tuple(e for f in symptoms for e in f.evidence[:1] if e.metric not in named),
        magnitude=max([parallelism.magnitude, *(f.magnitude for f in symptoms)]),
        cost_s=largest_cost([parallelism, *symptoms]),
        step_s=parallelism.step_s or next((f.step_s for f in symptoms if f.step_s), None),
        title=parallelism.title + ("" if exchange_only else JITTER_TOO),
    )
    out = [replace(f, severity="info", title=f"{f.title} ({note})") if f in symptoms else f for f in findings]
    out[index] = merged
    return out


def parallelism_title(
    ranks: list[int],
    util_pct: float | None,
    step_s: float | None,
    exchange: tuple[int, float, float] | None = None,
    little_mfu: float | None = None,
    small_kernels: bool = False,
    little_work: int | None = None,
) -> str:
    if small_kernels:
        return f"{ranks_text(ranks)}: the GPU runs kernels most of the time but they do little work: small kernels"
    title = _title(ranks, util_pct, step_s, exchange, little_work)
    if little_mfu is None:
        return title
    share = pct(little_mfu)
    shown = f"{share:.1f}" if share >= 1 else f"{share:.2g}"  # 8.0%, 0.0047%: never a small share as 0.0%
    return f"{title}; its compute reaches {shown}% of the device's peak FLOP/s"


def _title(
    ranks: list[int],
    util_pct: float | None,
    step_s: float | None,
    exchange: tuple[int, float, float] | None,
    little_work: int | None,
) -> str:
    who = ranks_text(ranks)
    if little_work is not None:
        return f"{who}: too little work per step at batch {little_work}"
    if util_pct is not None and util_pct < GPU_UTIL_LOW_WARN_PCT:
        return f"{who}: GPU busy only {util_pct:.0f}% with no input or comm wait: too little work per step"
    if step_s is not None and step_s < TINY_STEP_WARN_S:
        return f"{who}: steps of {step_s * 1e3:.1f} ms at a small batch: mostly fixed per-step overhead"
    if exchange is not None:
        batch, now, grown = exchange
        return (
            f"{who}: too little work per step at batch {batch}: the gradient exchange takes {pct(now):.0f}% of each "
            f"step only because the step is short; at batch {BATCH_GROWTH * batch} it would be about {pct(grown):.0f}%"
        )
    return f"{who}: the GPU is busy for a small part of each step: too little work per step"


def parallelism_suggestion(rank: RankFigures, *, launch_bound: bool) -> str:
    batch = rank.hello.loader_batch_size
    bigger = f"DataLoader(batch_size={batch * 4})" if batch else "a larger batch_size"
    text = f"Give each step more work: {bigger}, scaling the learning rate with it"
    if launch_bound:
        text += "; cut per-step launch overhead with torch.compile(model, mode='reduce-overhead') (CUDA graphs)"
    return text + "; or accumulate gradients over several micro-batches inside model.no_sync()."
