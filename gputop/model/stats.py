"""A rank's figures over a run of windows: pure arithmetic on protocol windows.

Each figure has one definition here.  ``rank_stats`` gives them over a span
(``gputop.model.figures`` calls it once per rank and refresh); the
``window_*`` functions give the same figures for a single window, for the
histories.  "Loader wait %" is time blocked in the tracked loader's ``next()``
divided by wall step time, over the same steps, everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gputop.protocol import Window, legacy_hist_to_sketch, sketch_quantile_s, sketch_value_s

# A stall is a step that takes at least this many times the median step: a
# checkpoint save, an evaluation pass, a GC pause or a slow batch among ordinary
# steps.  Three times, so the tail of a noisy but steady run (p95 ~ 1.5x p50 on
# 2 shared cores) is never one.
STALL_FACTOR = 3.0

# DDP's first iteration rebuilds its gradient buckets in the order gradients
# became ready, and pays lazy allocation: its timings are no typical step's.
DDP_WARMUP_ITERATIONS = 1


@dataclass(frozen=True)
class RankStats:
    """A rank over a span of windows.  None means not measured (N/A)."""

    windows: int
    steps: int
    steps_per_s: float | None
    step_time_mean_s: float | None
    step_time_p50_s: float | None
    step_time_p95_s: float | None
    step_time_max_s: float | None
    gpu_step_time_p50_s: float | None
    samples_per_s: float | None
    loader_wait_s: float | None  # per step
    loader_wait_frac: float | None  # of wall step time
    forward_s: float | None  # per optimizer step: DDP's timed micro-batch x micro_batches
    backward_s: float | None
    comm_s: float | None
    overlap_s: float | None
    exposed_comm_s: float | None
    exposed_comm_frac: float | None  # of wall step time
    mem_allocated_bytes: int | None
    mem_reserved_bytes: int | None
    mem_peak_bytes: int | None
    mem_total_bytes: int | None
    alloc_retries: int | None
    ooms: int | None
    cpu_pct: float | None
    rss_bytes: int | None
    threads: int | None
    workers: int | None
    workers_cpu_pct: float | None
    dropped: int
    # CPU contention, from the run-queue wait (ready to run, no CPU free):
    main_cpu_wait_frac: float | None = None  # the training thread's wait over wall time
    cpu_starved_frac: float | None = None  # the rank's and its workers' wait over (wait + CPU time)
    workers_cpu_starved_frac: float | None = None  # the workers' alone
    # The standard error of the shares, from their per-window values (None: fewer than 3 windows):
    # a share near a threshold is decided by its band, share +- 2 errors, not by its point.
    loader_wait_frac_se: float | None = None
    exposed_comm_frac_se: float | None = None
    # Forwards per optimizer step: k under gradient accumulation, where DDP times only the
    # synchronising micro-batch and forward_s/backward_s are scaled by k (an estimate).
    micro_batches: float | None = None
    cpu_demand_cores: float | None = None  # the rank's and its workers' threads ready to run, on average (CPU + wait)
    # Stalls: steps of at least STALL_FACTOR x the median step (None: too few steps to say).
    stall_steps: int | None = None
    stall_mean_s: float | None = None  # a stall step's mean duration
    stall_frac: float | None = None  # time lost to stalls (beyond a median step each) over all step time
    stall_loader_frac: float | None = None  # of the named stall steps' time, the share spent waiting for a batch
    stall_in_comm_frac: float | None = None  # of the stalls' excess, the share this rank waited in exposed comm
    # What gputop itself cost the rank (the reporter's self-accounting); None from older reporters.
    reporter_cpu_pct: float | None = None  # the reporter thread, 100 = one core
    hook_s_per_step: float | None = None  # training-thread time inside gputop per step
    gputop_cpu_frac: float | None = None  # gputop's CPU (thread + hooks) over the rank process's CPU
    sent_bytes_per_s: float | None = None

    @property
    def other_s(self) -> float | None:
        """Step time not explained by loader wait, compute or exposed comm."""
        parts = (self.loader_wait_s, self.forward_s, self.backward_s, self.exposed_comm_s)
        if self.step_time_mean_s is None or any(p is None for p in parts):
            return None
        return max(self.step_time_mean_s - sum(p for p in parts if p is not None), 0.0)


@dataclass(frozen=True)
class _DdpMeans:
    """The per-iteration means of DDP's figures over a rank's samples, from one pass."""

    forward_s: float | None
    backward_s: float | None
    comm_s: float | None
    overlap_s: float | None
    exposed_comm_s: float | None
    exposed_comm_fracs: list[float]  # each sample window's exposed comm over its mean step, for the error band


def _ddp_means(samples: Sequence[Window]) -> _DdpMeans:
    """Each DDP figure's per-iteration mean, each sample weighted by the iterations it averages, in one pass.

    Also each sample window's exposed comm over its mean step.  One loop for the
    five figures: at many ranks this runs for every rank on every refresh.
    """
    forward = backward = comm = overlap = exposed_sum = 0.0
    forward_n = backward_n = comm_n = overlap_n = exposed_n = 0
    fracs: list[float] = []
    for w in samples:
        n = w.ddp_steps or 1
        if w.forward_s is not None:
            forward += w.forward_s * n
            forward_n += n
        if w.backward_s is not None:
            backward += w.backward_s * n
            backward_n += n
        if w.overlap_s is not None:
            overlap += w.overlap_s * n
            overlap_n += n
        if w.comm_s is not None:
            comm += w.comm_s * n
            comm_n += n
        if (exposed := w.exposed_comm_s) is not None:
            exposed_sum += exposed * n
            exposed_n += n
            timed = w.timed
            if timed > 0 and (frac := share_of_step(exposed, w.step_time_sum_s / timed)) is not None:
                fracs.append(frac)
    return _DdpMeans(
        forward / forward_n if forward_n else None,
        backward / backward_n if backward_n else None,
        comm / comm_n if comm_n else None,
        overlap / overlap_n if overlap_n else None,
        exposed_sum / exposed_n if exposed_n else None,
        fracs,
    )


def _covers_ddp_warmup(w: Window) -> bool:
    """Whether the window's DDP figures include DDP's first iteration(s)."""
    return w.ddp_iteration is not None and w.ddp_iteration - (w.ddp_steps or 1) < DDP_WARMUP_ITERATIONS


def micro_batches_per_step(windows: Sequence[Window]) -> float | None:
    """Forwards with autograd on per optimizer step, over the windows that count both (None: not counted)."""
    forwards = steps = 0
    for w in windows:
        if w.forwards is not None and w.steps:
            forwards += w.forwards
            steps += w.steps
    return forwards / steps if steps and forwards else None


def _scaled(value: float | None, factor: float) -> float | None:
    """DDP times one micro-batch per step: the step's k micro-batches take about k times as long."""
    return None if value is None else value * factor


def _at_most(value: float | None, limit: float | None) -> float | None:
    return value if value is None or limit is None else min(value, limit)


def _newest(windows: Sequence[Window], name: str) -> Window | None:
    for w in reversed(windows):
        if getattr(w, name) is not None:
            return w
    return None


# Fewer windows than this give no error estimate worth the name.
MIN_WINDOWS_FOR_ERROR = 3


def standard_error(values: Sequence[float]) -> float | None:
    """The standard error of the mean of ``values`` (sample stdev / sqrt(n)); None for too few values."""
    n = len(values)
    if n < MIN_WINDOWS_FOR_ERROR:
        return None
    try:
        mean = sum(values) / n
        variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    except OverflowError:  # shares of absurd windows (a hostile or broken reporter): no band
        return None
    return (variance / n) ** 0.5 if math.isfinite(variance) else None


def median(values: Sequence[float]) -> float | None:
    """The median, or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def leave_one_out_medians(values: Sequence[float]) -> list[float | None]:
    """For each value, the median of all the others (None where there are no others).

    ``[median(values without i) for i]`` in one sort instead of one per value: at
    1,024 ranks the straggler rule compared every rank with the other 1,023.
    """
    n = len(values)
    if n < 2:
        return [None] * n
    positions = sorted(range(n), key=values.__getitem__)
    ordered = [values[i] for i in positions]
    m = n - 1  # how many the others are
    mid = m // 2

    def other(j: int, removed: int) -> float:
        """The j-th smallest of the others, when the value at sorted position ``removed`` is left out."""
        return ordered[j] if j < removed else ordered[j + 1]

    result: list[float | None] = [None] * n
    for removed, i in enumerate(positions):
        result[i] = other(mid, removed) if m % 2 else (other(mid - 1, removed) + other(mid, removed)) / 2
    return result


def count_steps(windows: Sequence[Window]) -> int:
    """Steps made across the windows, robust to windows lost in between.

    Uses the cumulative ``step_total``: last total minus the total before the
    first window.  Equals the sum of ``steps`` when no window went missing.
    """
    if not windows:
        return 0
    first, last = windows[0], windows[-1]
    return max(last.step_total - (first.step_total - first.steps), 0)


def loader_wait_share(loader_wait_s: float, step_time_s: float, *, tracked: bool) -> float | None:
    """Time blocked in the tracked loader over wall step time, both summed over the same steps."""
    return loader_wait_s / step_time_s if (tracked and step_time_s > 0) else None


def share_of_step(per_step_s: float | None, step_time_mean_s: float | None) -> float | None:
    """A per-step duration as a share of the mean wall step."""
    return per_step_s / step_time_mean_s if (per_step_s is not None and step_time_mean_s) else None


def window_step_s(w: Window) -> float | None:
    """One window's step time: its exact p50, else its mean."""
    return w.step_time_p50_s if w.step_time_p50_s is not None else w.step_time_mean_s


def window_loader_wait_frac(w: Window) -> float | None:
    return loader_wait_share(w.loader_wait_s, w.step_time_sum_s, tracked=w.loader_batches > 0)


def window_exposed_comm_frac(w: Window) -> float | None:
    return share_of_step(w.exposed_comm_s, w.step_time_mean_s)


@dataclass(frozen=True)
class Stalls:
    """The stall figures of a rank over its windows (see ``stalls``)."""

    steps: int
    mean_s: float | None
    frac: float
    loader_frac: float | None
    in_comm_frac: float | None


def stalls(windows: Sequence[Window], sketch: dict[int, int], p50_s: float, step_sum_s: float) -> Stalls:
    """Steps of at least STALL_FACTOR x the median: how many, how long, what share of the run, and where.

    Counts and durations come from the merged sketch (every step, 1% accurate);
    where the time went from each window's slowest steps: their loader wait,
    and, in the windows that hold a stall, this rank's exposed comm.  A rank
    that waits in the all-reduce while another stops shows the same long steps
    as the one that stopped, but its stall time is comm: that tells them apart.
    """
    line_s = STALL_FACTOR * p50_s
    count, total_s, excess_s = 0, 0.0, 0.0
    for bucket, n in sketch.items():
        value = sketch_value_s(bucket)
        if value >= line_s:
            count += n
            total_s += n * value
            excess_s += n * (value - p50_s)
    named_s = named_loader_s = window_excess_s = window_comm_s = 0.0
    for w in windows:
        stalled = [(d, loader) for d, loader in w.slow_steps if d >= line_s]
        if not stalled:
            continue
        named_s += sum(d for d, _ in stalled)
        named_loader_s += sum(loader for _, loader in stalled)
        if w.exposed_comm_s is not None:
            window_excess_s += sum(d - p50_s for d, _ in stalled)
            window_comm_s += w.exposed_comm_s * (w.ddp_steps or w.timed or 1)
    return Stalls(
        steps=count,
        mean_s=total_s / count if count else None,
        frac=excess_s / step_sum_s if step_sum_s > 0 else 0.0,
        loader_frac=named_loader_s / named_s if named_s > 0 else None,
        in_comm_frac=min(window_comm_s / window_excess_s, 1.0) if window_excess_s > 0 else None,
    )


def starved_share(wait_s: float, cpu_s: float) -> float | None:
    """Of the time threads were ready to run, the share they waited for a CPU (0: never, 1: always)."""
    return wait_s / (wait_s + cpu_s) if wait_s + cpu_s > 0 else None


class _CpuWait:
    """Run-queue wait and CPU time summed over the windows that measure both."""

    def __init__(self) -> None:
        self.main_wait_s = self.main_span_s = 0.0
        self.wait_s = self.cpu_s = self.span_s = 0.0
        self.workers_wait_s = self.workers_cpu_s = 0.0
        self.main_seen = self.seen = self.workers_seen = False

    def add(self, w: Window) -> None:
        dt = w.t1 - w.t0
        if w.main_cpu_wait_s is not None:
            self.main_seen = True
            self.main_wait_s += w.main_cpu_wait_s
            self.main_span_s += dt
        # The compute threads' own CPU time where the reporter measures it, else the process's.
        run_s = w.cpu_run_s if w.cpu_run_s is not None else (None if w.cpu_pct is None else w.cpu_pct / 100.0 * dt)
        if w.cpu_wait_s is not None and run_s is not None:
            self.seen = True
            self.span_s += dt
            self.wait_s += w.cpu_wait_s
            self.cpu_s += run_s
            if w.workers_cpu_wait_s is not None and w.workers_cpu_pct is not None:
                self.workers_seen = True
                self.workers_wait_s += w.workers_cpu_wait_s
                self.workers_cpu_s += w.workers_cpu_pct / 100.0 * dt

    def main_frac(self) -> float | None:
        return self.main_wait_s / self.main_span_s if self.main_seen and self.main_span_s > 0 else None

    def starved_frac(self) -> float | None:
        if not self.seen:
            return None
        return starved_share(self.wait_s + self.workers_wait_s, self.cpu_s + self.workers_cpu_s)

    def demand_cores(self) -> float | None:
        if not self.seen or self.span_s <= 0:
            return None
        return (self.wait_s + self.cpu_s + self.workers_wait_s + self.workers_cpu_s) / self.span_s

    def workers_starved_frac(self) -> float | None:
        return starved_share(self.workers_wait_s, self.workers_cpu_s) if self.workers_seen else None


class _SelfCost:
    """Sums of the self-accounting fields over the windows that carry them."""

    def __init__(self) -> None:
        self.span_s = self.reporter_cpu_s = self.hook_s = 0.0
        self.sent_bytes = self.steps = 0
        self.rank_cpu_s = 0.0  # the rank process's CPU over the windows that have both figures
        self.gputop_cpu_s = 0.0  # gputop's part of it

    def add(self, w: Window) -> None:
        if w.reporter_cpu_s is None or w.hook_s is None:
            return
        self.span_s += w.t1 - w.t0
        self.reporter_cpu_s += w.reporter_cpu_s
        self.hook_s += w.hook_s
        self.sent_bytes += w.sent_bytes or 0
        self.steps += w.steps
        if w.cpu_pct is not None:
            self.rank_cpu_s += w.cpu_pct / 100.0 * (w.t1 - w.t0)
            self.gputop_cpu_s += w.reporter_cpu_s + w.hook_s

    def reporter_cpu_pct(self) -> float | None:
        return 100.0 * self.reporter_cpu_s / self.span_s if self.span_s > 0 else None

    def hook_s_per_step(self) -> float | None:
        return self.hook_s / self.steps if self.steps else None

    def cpu_frac(self) -> float | None:
        return self.gputop_cpu_s / self.rank_cpu_s if self.rank_cpu_s > 0 else None

    def sent_bytes_per_s(self) -> float | None:
        return self.sent_bytes / self.span_s if self.span_s > 0 else None


def rank_stats(windows: Sequence[Window]) -> RankStats:
    """Summarise a rank's windows (oldest first) in one pass.

    DDP figures are averaged over distinct sampled iterations: DDP times only
    every Nth iteration and each sample repeats in the windows until the next,
    so averaging windows would weight a sample by how long it lingered.  A
    window that averages several iterations (``ddp_steps``) weighs that many.
    DDP's first iteration is left out when later ones are known: it rebuilds
    the gradient buckets and pays one-time allocation, so it is no typical step.
    """
    step_count = 0
    timed_count = 0  # steps the time totals cover
    step_sum_s = 0.0
    loader_total = 0.0
    tracked = False
    windows_with_steps = 0
    last_with_steps: Window | None = None
    sketch: dict[int, int] = {}
    max_step: float | None = None
    gpu_p50s: list[float] = []
    samples_total = 0
    samples_seen = False
    active_span = 0.0
    ddp_samples: dict[int, Window] = {}
    peak: int | None = None
    cpu_sum = workers_cpu_sum = 0.0
    cpu_n = workers_cpu_n = 0
    dropped = 0
    cost = _SelfCost()
    cpu_wait = _CpuWait()
    loader_fracs: list[float] = []  # each window's loader wait share, for the error band
    for w in windows:
        cost.add(w)
        cpu_wait.add(w)
        active_span += w.t1 - w.t0
        if w.loader_batches:
            tracked = True
        step_count += w.steps
        if (timed := w.timed) > 0:
            if (loader_frac := window_loader_wait_frac(w)) is not None:
                loader_fracs.append(loader_frac)
            windows_with_steps += 1
            last_with_steps = w
            timed_count += timed
            step_sum_s += w.step_time_sum_s
            loader_total += w.loader_wait_s
            for bucket, count in (w.step_sketch or legacy_hist_to_sketch(w.step_hist)).items():
                sketch[bucket] = sketch.get(bucket, 0) + count
            if w.step_time_max_s is not None and (max_step is None or w.step_time_max_s > max_step):
                max_step = w.step_time_max_s
        if w.gpu_step_time_p50_s is not None:
            gpu_p50s.append(w.gpu_step_time_p50_s)
        if w.samples is not None:
            samples_total += w.samples
            samples_seen = True
        if w.comm_s is not None:
            ddp_samples[w.ddp_iteration if w.ddp_iteration is not None else -w.seq] = w
        if w.mem_peak_bytes is not None and (peak is None or w.mem_peak_bytes > peak):
            peak = w.mem_peak_bytes
        if w.cpu_pct is not None:
            cpu_sum += w.cpu_pct
            cpu_n += 1
        if w.workers_cpu_pct is not None:
            workers_cpu_sum += w.workers_cpu_pct
            workers_cpu_n += 1
        if w.dropped > dropped:
            dropped = w.dropped

    mean_step = step_sum_s / timed_count if timed_count else None
    if windows_with_steps == 1 and last_with_steps is not None:  # one window: its exact figures beat the histogram
        p50, p95 = last_with_steps.step_time_p50_s, last_with_steps.step_time_p95_s
    else:
        # A bucket's value can lie above the slowest step in it: never report a p95 above the max.
        p50, p95 = (_at_most(sketch_quantile_s(sketch, q), max_step) for q in (0.5, 0.95))
    stall = stalls(windows, sketch, p50, step_sum_s) if p50 is not None and sketch else None
    ddp = [w for w in ddp_samples.values() if not _covers_ddp_warmup(w)] or list(ddp_samples.values())
    ddp_means = _ddp_means(ddp)
    exposed = ddp_means.exposed_comm_s
    micro = micro_batches_per_step(windows)
    scale = micro if micro is not None and micro > 1.0 else 1.0

    # Fields a probe fills together come from the newest window that probe filled.
    memory = _newest(windows, "mem_allocated_bytes")
    process = _newest(windows, "rss_bytes")

    def last(name: str) -> Any:
        for source in (memory, process):
            if source is not None and getattr(source, name) is not None:
                return getattr(source, name)
        newest = _newest(windows, name)  # a field its probe's usual partner left empty
        return None if newest is None else getattr(newest, name)

    return RankStats(
        windows=len(windows),
        steps=count_steps(windows),
        steps_per_s=step_count / active_span if active_span > 0 else None,
        step_time_mean_s=mean_step,
        step_time_p50_s=p50,
        step_time_p95_s=p95,
        step_time_max_s=max_step,
        gpu_step_time_p50_s=median(gpu_p50s),
        samples_per_s=samples_total / active_span if samples_seen and active_span > 0 else None,
        loader_wait_s=loader_total / timed_count if (timed_count and tracked) else None,
        loader_wait_frac=loader_wait_share(loader_total, step_sum_s, tracked=tracked),
        forward_s=_scaled(ddp_means.forward_s, scale),
        backward_s=_scaled(ddp_means.backward_s, scale),
        micro_batches=micro,
        comm_s=ddp_means.comm_s,
        overlap_s=ddp_means.overlap_s,
        exposed_comm_s=exposed,
        exposed_comm_frac=share_of_step(exposed, mean_step),
        mem_allocated_bytes=last("mem_allocated_bytes"),
        mem_reserved_bytes=last("mem_reserved_bytes"),
        mem_peak_bytes=peak,
        mem_total_bytes=last("mem_total_bytes"),
        alloc_retries=last("alloc_retries"),
        ooms=last("ooms"),
        cpu_pct=cpu_sum / cpu_n if cpu_n else None,
        rss_bytes=last("rss_bytes"),
        threads=last("threads"),
        workers=last("workers"),
        workers_cpu_pct=workers_cpu_sum / workers_cpu_n if workers_cpu_n else None,
        dropped=dropped,
        main_cpu_wait_frac=cpu_wait.main_frac(),
        cpu_starved_frac=cpu_wait.starved_frac(),
        workers_cpu_starved_frac=cpu_wait.workers_starved_frac(),
        cpu_demand_cores=cpu_wait.demand_cores(),
        loader_wait_frac_se=standard_error(loader_fracs),
        exposed_comm_frac_se=standard_error(ddp_means.exposed_comm_fracs),
        stall_steps=None if stall is None else stall.steps,
        stall_mean_s=None if stall is None else stall.mean_s,
        stall_frac=None if stall is None else stall.frac,
        stall_loader_frac=None if stall is None else stall.loader_frac,
        stall_in_comm_frac=None if stall is None else stall.in_comm_frac,
        reporter_cpu_pct=cost.reporter_cpu_pct(),
        hook_s_per_step=cost.hook_s_per_step(),
        gputop_cpu_frac=cost.cpu_frac(),
        sent_bytes_per_s=cost.sent_bytes_per_s(),
    )


def recent(windows: Sequence[Window], span_s: float) -> list[Window]:
    """The windows that ended within ``span_s`` of the newest one."""
    if not windows:
        return []
    cutoff = windows[-1].t1 - span_s
    return [w for w in windows if w.t1 > cutoff]
