"""A rank's figures over a run of windows: pure arithmetic on protocol windows.

Each figure has one definition here.  ``rank_stats`` gives them over a span
(``gputop.model.figures`` calls it once per rank and refresh); the
``window_*`` functions give the same figures for a single window, for the
histories.  "Loader wait %" is time blocked in the tracked loader's ``next()``
divided by wall step time, over the same steps, everywhere.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgspec

from gputop.combine import (
    COMBINE,
    DDP_MEAN,
    NEWEST_GROUPS,
    OWN_PHASES,
    loader_wait_share,
    other_seconds,
    share_of_step,
    window_loader_wait_frac,
)
from gputop.protocol import Window
from gputop.sketch import legacy_hist_to_sketch, sketch_quantiles_s, sketch_value_s

# A stall is a step that takes at least this many times the median step: a
# checkpoint save, an evaluation pass, a GC pause or a slow batch among ordinary
# steps.  Three times, so the tail of a noisy but steady run (p95 ~ 1.5x p50 on
# 2 shared cores) is never one.
STALL_FACTOR = 3.0

# DDP's first iteration rebuilds its gradient buckets in the order gradients
# became ready, and pays lazy allocation: its timings are no typical step's.
DDP_WARMUP_ITERATIONS = 1


class RankStats(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A rank over a span of windows.  None means not measured (N/A).

    A msgspec struct rather than a frozen dataclass: built for every rank on
    every refresh, and a frozen dataclass sets its 50 fields one
    ``object.__setattr__`` at a time (three times as long).  Numbers only: no
    cycles, so the garbage collector need not track it.
    """

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
    optimizer_s: float | None  # per step, in the optimizer's step (None: no optimizer hook timed it)
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
    # The standard error of the shares, from their per-window values (None: fewer than 3 windows),
    # widened for few windows (see ``standard_error``): a share near a threshold is decided by
    # its band, share +- 2 errors, a 95% interval, not by its point.
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
    stall_period_steps: int | None = None  # the stalls fall every N steps (from their step numbers)
    stall_regular: bool | None = None  # False: they fall at irregular steps; None: too few numbered stalls to say
    stall_level_shift: bool | None = None  # the steps turned slow and stayed so: a new level, not stops (Stalls)
    # What gputop itself cost the rank (the reporter's self-accounting); None from older reporters.
    reporter_cpu_pct: float | None = None  # the reporter thread, 100 = one core
    hook_s_per_step: float | None = None  # training-thread time inside gputop per step
    gputop_cpu_frac: float | None = None  # gputop's CPU (thread + hooks) over the rank process's CPU
    sent_bytes_per_s: float | None = None

    @property
    def other_s(self) -> float | None:
        """Step time outside every measured phase (gputop.combine.PHASES): loader, compute, optimizer, exposed comm."""
        # An optional phase this rank does not measure keeps its time outside the phases.
        parts = {p.seconds: v for p in OWN_PHASES if (v := getattr(self, p.seconds)) is not None or not p.optional}
        parts["exposed_comm_s"] = self.exposed_comm_s
        return other_seconds(self.step_time_mean_s, parts)


# DDP's per-iteration figures (gputop.combine: a mean weighted by the iterations each window
# averaged), and the exposed comm each window derives from two of them.
DDP_FIGURES: tuple[str, ...] = (*(name for name, how in COMBINE.items() if how is DDP_MEAN), "exposed_comm_s")


class _DdpSample(msgspec.Struct, frozen=True, gc=False):
    """What one sampled DDP iteration adds: each figure times the iterations it averages, and those iterations.

    A struct the garbage collector never tracks (numbers only): a span holds one per
    sample, and at 1,024 ranks 41,000 tracked tuple subclasses (NamedTuples, which the
    collector never untracks) made every full collection ~100 ms longer.
    """

    sums: tuple[float, ...]  # per DDP_FIGURES
    counts: tuple[int, ...]  # per DDP_FIGURES: the iterations behind each sum, 0 where not measured
    warmup: bool  # it includes DDP's first iteration(s)
    exposed_frac: float | None  # its exposed comm over its window's mean step, for the error band


def _ddp_sample(w: Window) -> _DdpSample:
    n = w.ddp_steps or 1
    values = [getattr(w, name) for name in DDP_FIGURES]
    exposed, timed = w.exposed_comm_s, w.timed
    return _DdpSample(
        tuple(0.0 if v is None else v * n for v in values),
        tuple(0 if v is None else n for v in values),
        _covers_ddp_warmup(w),
        share_of_step(exposed, w.step_time_sum_s / timed) if exposed is not None and timed > 0 else None,
    )


@dataclass(frozen=True)
class _DdpMeans:
    """The per-iteration means of DDP's figures over a rank's distinct samples."""

    means: dict[str, float | None]  # per DDP_FIGURES
    exposed_comm_fracs: list[float]  # each sample's exposed comm over its window's mean step, for the error band

    @classmethod
    def of(cls, samples: Sequence[_DdpSample]) -> _DdpMeans:
        """Each figure's mean, each sample weighted by the iterations it averages.

        DDP's first iteration is left out when later ones are known: it rebuilds
        the gradient buckets and pays one-time allocation, so it is no typical step.
        """
        samples = [s for s in samples if not s.warmup] or samples
        sums = [sum(column) for column in zip(*(s.sums for s in samples), strict=True)] if samples else []
        counts = [sum(column) for column in zip(*(s.counts for s in samples), strict=True)] if samples else []
        means = {name: (sums[i] / counts[i] if samples and counts[i] else None) for i, name in enumerate(DDP_FIGURES)}
        return cls(means, [frac for s in samples if (frac := s.exposed_frac) is not None])


def _ddp_key(w: Window) -> int:
    """The sampled iteration a window's DDP figures come from (a window without one is its own sample)."""
    return w.ddp_iteration if w.ddp_iteration is not None else -w.seq


def _covers_ddp_warmup(w: Window) -> bool:
    """Whether the window's DDP figures include DDP's first iteration(s)."""
    return w.ddp_iteration is not None and w.ddp_iteration - (w.ddp_steps or 1) < DDP_WARMUP_ITERATIONS


def _scaled(value: float | None, factor: float) -> float | None:
    """DDP times one micro-batch per step: the step's k micro-batches take about k times as long."""
    return None if value is None else value * factor


def _at_most(value: float | None, limit: float | None) -> float | None:
    return value if value is None or limit is None else min(value, limit)


# Fewer windows than this give no error estimate worth the name.
MIN_WINDOWS_FOR_ERROR = 3

# Student's t, two-sided 95%, at tabulated degrees of freedom (windows - 1), down to 2.0.
# A band of +- 2 standard errors holds the mean 95% of the time only for many windows:
# from 3 windows the sample's own spread is itself a guess, and the band must be
# t(2) = 4.3 errors wide.  The live dashboard judges a run's first seconds on a
# handful of windows, exactly where a normal band calls a warm-up blip a verdict.
_T95_DF = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 30, 40, 60)
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.179, 2.131, 2.086, 2.042, 2.021, 2.0)


def t95(df: int) -> float:
    """Student's t two-sided 95% quantile: the tabulated one at or below ``df`` (a little wide between rows)."""
    if df < 1:
        raise ValueError("df must be at least 1")
    return _T95[bisect.bisect_right(_T95_DF, df) - 1]


def standard_error(values: Sequence[float]) -> float | None:
    """The standard error of the mean of ``values``, widened for few values; None for too few.

    Sample stdev / sqrt(n), times t95(n - 1) / 2: so that the band of +- 2 of
    these errors, which the rules read, is a 95% interval however few the
    windows (Student's t), not just for many.
    """
    n = len(values)
    if n < MIN_WINDOWS_FOR_ERROR:
        return None
    try:
        mean = sum(values) / n
        deviations = [v - mean for v in values]
        variance = sum(map(operator.mul, deviations, deviations)) / (n - 1)  # twice a generator's speed
    except OverflowError:  # shares of absurd windows (a hostile or broken reporter): no band
        return None
    return (variance / n) ** 0.5 * t95(n - 1) / 2.0 if math.isfinite(variance) else None


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


def window_step_s(w: Window) -> float | None:
    """One window's step time: its exact p50, else its mean."""
    return w.step_time_p50_s if w.step_time_p50_s is not None else w.step_time_mean_s


@dataclass(frozen=True)
class Stalls:
    """The stall figures of a rank over its windows (see ``stalls``)."""

    steps: int
    mean_s: float | None
    frac: float
    loader_frac: float | None
    in_comm_frac: float | None
    # From the stall steps' numbers: "every N steps" (period), or irregular (period None, regular False);
    # both None when too few stalls carry a number to tell.
    period_steps: int | None = None
    regular: bool | None = None
    # Every window since the first stall has a typical step past the line: the steps turned slow and stayed
    # so (a loader gone cold), a new level rather than stops now and then.
    level_shift: bool = False


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
    for bucket in sorted(sketch):  # in bucket order: the sums do not depend on the order steps came in
        n = sketch[bucket]
        value = sketch_value_s(bucket)
        if value >= line_s:
            count += n
            total_s += n * value
            excess_s += n * (value - p50_s)
    named_s = named_loader_s = window_excess_s = window_comm_s = 0.0
    numbers: set[int] = set()
    since_first: list[Window] = []  # the windows with steps from the first that holds a stall on
    for w in windows:
        stalled = [(d, loader) for d, loader in w.slow_steps if d >= line_s]
        if w.steps and (stalled or since_first):
            since_first.append(w)
        if not stalled:
            continue
        if len(w.slow_step_numbers) == len(w.slow_steps):
            numbers.update(n for (d, _), n in zip(w.slow_steps, w.slow_step_numbers, strict=True) if d >= line_s and n)
        named_s += sum(d for d, _ in stalled)
        named_loader_s += sum(loader for _, loader in stalled)
        if w.exposed_comm_s is not None:
            window_excess_s += sum(d - p50_s for d, _ in stalled)
            window_comm_s += w.exposed_comm_s * (w.ddp_steps or w.timed or 1)
    period, regular = stall_period(sorted(numbers))
    return Stalls(
        steps=count,
        mean_s=total_s / count if count else None,
        frac=excess_s / step_sum_s if step_sum_s > 0 else 0.0,
        loader_frac=named_loader_s / named_s if named_s > 0 else None,
        in_comm_frac=min(window_comm_s / window_excess_s, 1.0) if window_excess_s > 0 else None,
        period_steps=period,
        regular=regular,
        level_shift=len(since_first) >= LEVEL_SHIFT_WINDOWS
        and all(w.step_time_p50_s is not None and w.step_time_p50_s >= line_s for w in since_first),
    )


# Windows with steps, all slow since the first stall, that make a new level: two, so that one long stop
# alone in the newest window (a checkpoint's step, 1.5 s in a 0.5-s window) is not one.
LEVEL_SHIFT_WINDOWS = 2


# Stalls whose numbers tell a period: at least this many, and this share of them on its progression.
PERIOD_MIN_STALLS = 3
PERIOD_SHARE = 0.6
PERIOD_FILL = 0.75
PERIOD_MAX_STALLS = 40


def stall_period(numbers: Sequence[int]) -> tuple[int | None, bool | None]:
    """(N, True) when stalls fall every N steps, (None, False) when they do not; (None, None): too few to say.

    Each candidate N (a difference of two stall steps) is judged by its best
    progression: how many stalls lie on it (at least ``PERIOD_SHARE`` of them,
    so a few stray ones, a rank descheduled on a busy machine or DDP's first
    iteration, do not hide a checkpoint every 20 steps) and how full it is
    between its first and last stall (at least ``PERIOD_FILL``, so 10 does not
    pass for 20 by catching noise in the gaps).  The N holding the most stalls
    wins, the longer on a tie.  From 10 steps on, one step late still counts:
    a waiting rank's long step can be the one after the stopping rank's.
    """
    numbers = numbers[-PERIOD_MAX_STALLS:]  # the newest: a long run's period is its recent one
    if len(numbers) < PERIOD_MIN_STALLS:
        return None, None
    needed = max(PERIOD_MIN_STALLS, math.ceil(PERIOD_SHARE * len(numbers)))
    # A period is the gap between a stall and one of the next three (a stray stall in between),
    # give or take the one step a waiting rank's stall can lag.
    gaps = {numbers[i + k] - numbers[i] for k in (1, 2, 3) for i in range(len(numbers) - k)}
    candidates = gaps | {g + d for g in gaps if g >= 10 for d in (-1, 1)}
    best: tuple[int, int] | None = None  # (stalls on it, period)
    for period in (c for c in candidates if c >= 3):
        slack = 1 if period >= 10 else 0
        for start in numbers:
            on = [n for n in numbers if n >= start and (n - start) % period <= slack]
            full = len({(n - start) // period for n in on}) >= PERIOD_FILL * ((on[-1] - start) // period + 1)
            if len(on) >= needed and full and (best is None or (len(on), period) > best):
                best = (len(on), period)
    return (best[1], True) if best is not None else (None, False)


def starved_share(wait_s: float, cpu_s: float) -> float | None:
    """Of the time threads were ready to run, the share they waited for a CPU (0: never, 1: always)."""
    return wait_s / (wait_s + cpu_s) if wait_s + cpu_s > 0 else None


class _Parts(NamedTuple):
    """A window's part of each float total: 0.0 where it does not count towards one.

    Floats are summed afresh from these when the figures are read, in window
    order, never by taking away what left: a value that entered and left would
    leave its rounding behind, and a total that should be 0 ("no CPU used")
    would not be.
    """

    step_s: float  # wall step time, over the windows with timed steps
    loader_s: float  # loader wait, over the same
    optimizer_s: float  # in the optimizer's step, over the windows with timed steps that time it
    span_s: float  # the windows' durations
    cpu_pct: float
    workers_cpu_pct: float
    # gputop's self-accounting, over the windows that carry it:
    own_span_s: float
    reporter_cpu_s: float
    hook_s: float
    rank_cpu_s: float  # the rank process's CPU where the window has both figures
    gputop_cpu_s: float  # gputop's part of it
    # Run-queue wait and CPU time, over the windows that measure both:
    main_wait_s: float
    main_span_s: float
    wait_span_s: float
    wait_s: float
    run_s: float
    workers_wait_s: float
    workers_run_s: float


_NO_PARTS = _Parts(*[0.0] * len(_Parts._fields))


def _parts(w: Window) -> tuple[float, ...]:
    """The window's ``_Parts``, kept as a plain tuple (see ``_DdpSample``: a span holds one a window)."""
    dt = w.t1 - w.t0
    timed = w.timed > 0
    own = w.reporter_cpu_s is not None and w.hook_s is not None
    # The compute threads' own CPU time where the reporter measures it, else the process's.
    run_s = w.cpu_run_s if w.cpu_run_s is not None else (None if w.cpu_pct is None else w.cpu_pct / 100.0 * dt)
    waited = w.cpu_wait_s is not None and run_s is not None
    workers = waited and w.workers_cpu_wait_s is not None and w.workers_cpu_pct is not None
    return tuple(
        _Parts(
            step_s=w.step_time_sum_s if timed else 0.0,
            loader_s=w.loader_wait_s if timed else 0.0,
            optimizer_s=w.optimizer_s or 0.0 if timed else 0.0,
            span_s=dt,
            cpu_pct=w.cpu_pct or 0.0,
            workers_cpu_pct=w.workers_cpu_pct or 0.0,
            own_span_s=dt if own else 0.0,
            reporter_cpu_s=w.reporter_cpu_s or 0.0 if own else 0.0,
            hook_s=w.hook_s or 0.0 if own else 0.0,
            rank_cpu_s=w.cpu_pct / 100.0 * dt if own and w.cpu_pct is not None else 0.0,
            gputop_cpu_s=(w.reporter_cpu_s or 0.0) + (w.hook_s or 0.0) if own and w.cpu_pct is not None else 0.0,
            main_wait_s=w.main_cpu_wait_s or 0.0,
            main_span_s=dt if w.main_cpu_wait_s is not None else 0.0,
            wait_span_s=dt if waited else 0.0,
            wait_s=w.cpu_wait_s or 0.0 if waited else 0.0,
            run_s=run_s or 0.0 if waited else 0.0,
            workers_wait_s=w.workers_cpu_wait_s or 0.0 if workers else 0.0,
            workers_run_s=(w.workers_cpu_pct or 0.0) / 100.0 * dt if workers else 0.0,
        )
    )


class _SlidingMax:
    """The largest value over windows that leave oldest first: a monotonic queue, O(1) amortized."""

    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: deque[tuple[float, Window]] = deque()  # values decreasing, windows oldest first

    def push(self, value: float, w: Window) -> None:
        queue = self._queue
        while queue and queue[-1][0] <= value:
            queue.pop()
        queue.append((value, w))

    def pop(self, w: Window) -> None:
        """``w``, the oldest window, leaves."""
        if self._queue and self._queue[0][1] is w:
            self._queue.popleft()

    @property
    def value(self) -> float | None:
        return self._queue[0][0] if self._queue else None


# Fields a probe fills together (gputop.combine.NEWEST_GROUPS): a figure reads the newest window that has it.
_NEWEST_FIELDS = tuple(name for group in NEWEST_GROUPS for name in group)


class SpanSums:
    """A rank's figures over a span of windows, kept as windows enter (newest) and leave (oldest).

    ``rank_stats`` adds a span's windows and reads ``stats``; the dashboard keeps one
    per rank and slides it (``gputop.model.span``), so a refresh costs the windows
    that arrived and left, not the whole span.  Every figure's definition is here:
    counts kept as windows come and go, float totals summed from each window's
    ``_Parts``, monotonic queues for the maxima, the newest window that has a
    field for the gauges, and the distinct DDP samples.  Windows leave in the
    order they entered.
    """

    def __init__(self) -> None:
        self.parts: deque[tuple[float, ...]] = deque()  # each window's ``_Parts``
        self.steps = 0
        self.timed = 0  # steps the time totals cover
        self.tracked = 0  # windows with loader batches
        self.optimized = 0  # timed steps in the windows that time the optimizer's step
        self.with_steps = 0  # windows with timed steps
        self.sketch: dict[int, int] = {}
        self.samples = self.samples_seen = 0
        self.cpu_n = self.workers_cpu_n = 0
        self.forwards = self.forward_steps = 0  # over the windows that count both
        self.own_steps = self.own_sent_bytes = 0  # over the windows with self-accounting
        self.main_waited = self.waited = self.workers_waited = 0  # windows that measure each wait
        self.loader_fracs: deque[float] = deque()  # each window's loader wait share, for the error band
        self.gpu_p50s: list[float] = []  # sorted
        self.max_step = _SlidingMax()
        self.peak = _SlidingMax()
        self.dropped = _SlidingMax()
        self.slowest = _SlidingMax()  # the windows' slowest named steps, to skip the stall scan
        self.newest: dict[str, Window] = {}  # field (or "timed") -> the newest window that has it
        # DDP times every Nth iteration and a sample repeats in the windows until the next: each counts once.
        # By sample key: the newest window with it, how many windows have it, its sample once read.
        # Three dicts, not a list per key: a dict of windows and ints is not tracked by the GC (see _DdpSample).
        self.ddp: dict[int, Window] = {}
        self.ddp_windows: dict[int, int] = {}
        self.ddp_read: dict[int, _DdpSample] = {}

    @classmethod
    def of(cls, windows: Iterable[Window]) -> SpanSums:
        """The sums of ``windows``, oldest first."""
        sums = cls()
        for w in windows:
            sums.add(w)
        return sums

    def add(self, w: Window) -> None:
        """``w`` enters the span as its newest window."""
        self.parts.append(_parts(w))
        self._count(w, 1)
        if w.timed > 0:
            if (loader_frac := window_loader_wait_frac(w)) is not None:
                self.loader_fracs.append(loader_frac)
            if w.step_time_max_s is not None:
                self.max_step.push(w.step_time_max_s, w)
            self.newest["timed"] = w
        if w.gpu_step_time_p50_s is not None:
            bisect.insort(self.gpu_p50s, w.gpu_step_time_p50_s)
        if w.mem_peak_bytes is not None:
            self.peak.push(w.mem_peak_bytes, w)
        self.dropped.push(w.dropped, w)
        if w.slow_steps:
            self.slowest.push(max(w.slow_steps)[0], w)
        for name in _NEWEST_FIELDS:
            if getattr(w, name) is not None:
                self.newest[name] = w
        if w.comm_s is not None:
            key = _ddp_key(w)
            self.ddp[key] = w
            self.ddp_windows[key] = self.ddp_windows.get(key, 0) + 1
            self.ddp_read.pop(key, None)  # read again from the newest window

    def remove(self, w: Window) -> None:
        """``w``, the span's oldest window, leaves it."""
        self.parts.popleft()
        self._count(w, -1)
        if w.timed > 0 and window_loader_wait_frac(w) is not None:
            self.loader_fracs.popleft()
        if w.gpu_step_time_p50_s is not None:
            del self.gpu_p50s[bisect.bisect_left(self.gpu_p50s, w.gpu_step_time_p50_s)]
        for queue in (self.max_step, self.peak, self.dropped, self.slowest):
            queue.pop(w)
        newest = self.newest
        for name in (*_NEWEST_FIELDS, "timed"):
            if newest.get(name) is w:  # the newest with the field is the oldest: none other has it
                del newest[name]
        if w.comm_s is not None:
            key = _ddp_key(w)
            if (n := self.ddp_windows[key]) > 1:  # newer windows repeat the sample: the newest stays
                self.ddp_windows[key] = n - 1
            else:
                del self.ddp[key], self.ddp_windows[key]
                self.ddp_read.pop(key, None)

    def _ddp_samples(self) -> list[_DdpSample]:
        """The distinct samples in iteration order, however they came; each built once, when first read."""
        samples = []
        read = self.ddp_read
        for key, w in sorted(self.ddp.items()):  # keys are distinct: the windows are never compared
            sample = read.get(key)
            if sample is None:
                sample = read[key] = _ddp_sample(w)
            samples.append(sample)
        return samples

    def _count(self, w: Window, sign: int) -> None:
        """The counts: the same arithmetic entering (+1) and leaving (-1), exact for integers."""
        if w.loader_batches:
            self.tracked += sign
        self.steps += w.steps * sign
        if (timed := w.timed) > 0:
            self.with_steps += sign
            self.timed += timed * sign
            if w.optimizer_s is not None:
                self.optimized += timed * sign
            sketch = self.sketch
            for bucket, count in (w.step_sketch or legacy_hist_to_sketch(w.step_hist)).items():
                if total := sketch.get(bucket, 0) + count * sign:
                    sketch[bucket] = total
                else:
                    del sketch[bucket]
        if w.samples is not None:
            self.samples += w.samples * sign
            self.samples_seen += sign
        if w.cpu_pct is not None:
            self.cpu_n += sign
        if w.workers_cpu_pct is not None:
            self.workers_cpu_n += sign
        if w.forwards is not None and w.steps:
            self.forwards += w.forwards * sign
            self.forward_steps += w.steps * sign
        if w.reporter_cpu_s is not None and w.hook_s is not None:
            self.own_steps += w.steps * sign
            self.own_sent_bytes += (w.sent_bytes or 0) * sign
        if w.main_cpu_wait_s is not None:
            self.main_waited += sign
        if w.cpu_wait_s is not None and (w.cpu_run_s is not None or w.cpu_pct is not None):
            self.waited += sign
            if w.workers_cpu_wait_s is not None and w.workers_cpu_pct is not None:
                self.workers_waited += sign

    def stats(self, windows: Sequence[Window]) -> RankStats:
        """The figures of ``windows``, the span this holds (oldest first)."""
        t = _Parts(*map(sum, zip(*self.parts, strict=True))) if self.parts else _NO_PARTS
        max_step = self.max_step.value
        mean_step = t.step_s / self.timed if self.timed else None
        if self.with_steps == 1:  # one window: its exact figures beat the histogram
            only = self.newest["timed"]
            p50, p95 = only.step_time_p50_s, only.step_time_p95_s
        else:
            # A bucket's value can lie above the slowest step in it: never report a p95 above the max.
            p50, p95 = (_at_most(q, max_step) for q in sketch_quantiles_s(self.sketch, (0.5, 0.95)))
        stall = None
        if p50 is not None and self.sketch:
            slowest = self.slowest.value
            named = windows if slowest is not None and slowest >= STALL_FACTOR * p50 else ()
            stall = stalls(named, self.sketch, p50, t.step_s)
        ddp = _DdpMeans.of(self._ddp_samples())
        micro = self.forwards / self.forward_steps if self.forward_steps and self.forwards else None
        scale = micro if micro is not None and micro > 1.0 else 1.0
        tracked = self.tracked > 0
        newest = self.newest
        # Fields a probe fills together come from the newest window that probe filled.
        sources = [newest.get(group[0]) for group in NEWEST_GROUPS]

        def last(name: str) -> Any:
            for source in sources:
                if source is not None and getattr(source, name) is not None:
                    return getattr(source, name)
            newest_with = newest.get(name)  # a field its probe's usual partner left empty
            return None if newest_with is None else getattr(newest_with, name)

        peak = self.peak.value
        starved = self.waited > 0
        return RankStats(
            windows=len(windows),
            steps=count_steps(windows),
            steps_per_s=self.steps / t.span_s if t.span_s > 0 else None,
            step_time_mean_s=mean_step,
            step_time_p50_s=p50,
            step_time_p95_s=p95,
            step_time_max_s=max_step,
            gpu_step_time_p50_s=median(self.gpu_p50s),
            samples_per_s=self.samples / t.span_s if self.samples_seen and t.span_s > 0 else None,
            loader_wait_s=t.loader_s / self.timed if (self.timed and tracked) else None,
            loader_wait_frac=loader_wait_share(t.loader_s, t.step_s, tracked=tracked),
            forward_s=_scaled(ddp.means["forward_s"], scale),
            backward_s=_scaled(ddp.means["backward_s"], scale),
            micro_batches=micro,
            comm_s=ddp.means["comm_s"],
            overlap_s=ddp.means["overlap_s"],
            exposed_comm_s=ddp.means["exposed_comm_s"],
            exposed_comm_frac=share_of_step(ddp.means["exposed_comm_s"], mean_step),
            optimizer_s=t.optimizer_s / self.optimized if self.optimized else None,
            mem_allocated_bytes=last("mem_allocated_bytes"),
            mem_reserved_bytes=last("mem_reserved_bytes"),
            mem_peak_bytes=None if peak is None else int(peak),
            mem_total_bytes=last("mem_total_bytes"),
            alloc_retries=last("alloc_retries"),
            ooms=last("ooms"),
            cpu_pct=t.cpu_pct / self.cpu_n if self.cpu_n else None,
            rss_bytes=last("rss_bytes"),
            threads=last("threads"),
            workers=last("workers"),
            workers_cpu_pct=t.workers_cpu_pct / self.workers_cpu_n if self.workers_cpu_n else None,
            dropped=int(self.dropped.value or 0),
            # CPU contention, from the run-queue wait:
            main_cpu_wait_frac=t.main_wait_s / t.main_span_s if self.main_waited and t.main_span_s > 0 else None,
            cpu_starved_frac=starved_share(t.wait_s + t.workers_wait_s, t.run_s + t.workers_run_s) if starved else None,
            workers_cpu_starved_frac=(
                starved_share(t.workers_wait_s, t.workers_run_s) if self.workers_waited else None
            ),
            cpu_demand_cores=(
                (t.wait_s + t.run_s + t.workers_wait_s + t.workers_run_s) / t.wait_span_s
                if starved and t.wait_span_s > 0
                else None
            ),
            loader_wait_frac_se=standard_error(self.loader_fracs),
            exposed_comm_frac_se=standard_error(ddp.exposed_comm_fracs),
            stall_steps=None if stall is None else stall.steps,
            stall_mean_s=None if stall is None else stall.mean_s,
            stall_frac=None if stall is None else stall.frac,
            stall_loader_frac=None if stall is None else stall.loader_frac,
            stall_in_comm_frac=None if stall is None else stall.in_comm_frac,
            stall_period_steps=None if stall is None else stall.period_steps,
            stall_regular=None if stall is None else stall.regular,
            stall_level_shift=None if stall is None else stall.level_shift,
            # What gputop itself cost the rank:
            reporter_cpu_pct=100.0 * t.reporter_cpu_s / t.own_span_s if t.own_span_s > 0 else None,
            hook_s_per_step=t.hook_s / self.own_steps if self.own_steps else None,
            gputop_cpu_frac=t.gputop_cpu_s / t.rank_cpu_s if t.rank_cpu_s > 0 else None,
            sent_bytes_per_s=self.own_sent_bytes / t.own_span_s if t.own_span_s > 0 else None,
        )


def rank_stats(windows: Sequence[Window]) -> RankStats:
    """Summarise a rank's windows (oldest first): every figure as ``SpanSums`` defines it."""
    return SpanSums.of(windows).stats(windows)


def recent(windows: Sequence[Window], span_s: float) -> list[Window]:
    """The windows that ended within ``span_s`` of the newest one."""
    if not windows:
        return []
    cutoff = windows[-1].t1 - span_s
    return [w for w in windows if w.t1 > cutoff]
