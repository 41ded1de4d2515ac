"""A rank's figures over a span of windows, summed as windows enter (newest) and leave (oldest).

``rank_stats`` adds a span's windows and reads the figures; the dashboard keeps
one ``SpanSums`` per rank and slides it (``gputop.model.span``), so a refresh
costs the windows that arrived and left, not the whole span.  What each figure
means is ``RankStats``'s (``gputop.model.rank_stats``); how each window field
combines, ``gputop.combine``'s; the stalls', ``gputop.model.stalls``; DDP's
sampled timings, ``gputop.model.ddp_timings``.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gputop.combine import (
    COMBINE,
    NEWEST_GROUPS,
    OWN_PHASES,
    TOTAL,
    count_steps,
    loader_wait_share,
    other_seconds,
    share_of_step,
    window_loader_wait_frac,
)
from gputop.model.collectives import collective_figures
from gputop.model.ddp_timings import DdpMeans, DdpTimings, ddp_key, ddp_timings
from gputop.model.rank_stats import (
    CompileFigures,
    CpuUse,
    MemoryUse,
    OwnCost,
    PhaseTimes,
    RankStats,
    StallFigures,
    StepTimes,
    StepWork,
)
from gputop.model.stalls import STALL_FACTOR, stalls
from gputop.model.statistics import SlidingMax, median, standard_error
from gputop.model.window_parts import NO_PARTS, WindowParts, window_parts
from gputop.protocol import Window
from gputop.sketch import legacy_hist_to_sketch, sketch_quantiles_s

# The step's phases a window sums over its timed steps, but the loader's (its own figures, in WindowParts):
# read generically, so a phase declared in gputop.combine needs only its PhaseTimes field.
TIMED_PHASES = tuple(p.seconds for p in OWN_PHASES if COMBINE[p.seconds] is TOTAL and p.name != "loader")


def _scaled(value: float | None, factor: float) -> float | None:
    """DDP times one micro-batch per step: the step's k micro-batches take about k times as long."""
    return None if value is None else value * factor


def _at_most(value: float | None, limit: float | None) -> float | None:
    return value if value is None or limit is None else min(value, limit)


def starved_share(wait_s: float, cpu_s: float) -> float | None:
    """Of the time threads were ready to run, the share they waited for a CPU (0: never, 1: always)."""
    return wait_s / (wait_s + cpu_s) if wait_s + cpu_s > 0 else None


# Fields a probe fills together (gputop.combine.NEWEST_GROUPS): a figure reads the newest window that has it.
_NEWEST_FIELDS = tuple(name for group in NEWEST_GROUPS for name in group)


class SpanSums:
    """A rank's figures over a span of windows, kept as windows enter (newest) and leave (oldest).

    ``rank_stats`` adds a span's windows and reads ``stats``; the dashboard keeps one
    per rank and slides it (``gputop.model.span``), so a refresh costs the windows
    that arrived and left, not the whole span.  Every figure's definition is here:
    counts kept as windows come and go, float totals summed from each window's
    ``WindowParts``, monotonic queues for the maxima, the newest window that has a
    field for the gauges, and the distinct DDP samples.  Windows leave in the
    order they entered.
    """

    def __init__(self) -> None:
        self.parts: deque[tuple[float, ...]] = deque()  # each window's ``WindowParts``
        self.steps = 0
        self.timed = 0  # steps the time totals cover
        self.tracked = 0  # windows with loader batches
        # The step's phases a window sums over its timed steps (TIMED_PHASES): each window's totals, and the
        # timed steps of the windows that measure each.
        self.phase_parts: deque[tuple[float, ...]] = deque()
        self.phase_steps = [0] * len(TIMED_PHASES)
        self.with_steps = 0  # windows with timed steps
        self.sketch: dict[int, int] = {}
        self.samples = self.samples_seen = 0
        self.cpu_n = self.workers_cpu_n = 0
        self.flops_steps = 0  # steps whose FLOPs were counted (``WindowParts.flops`` holds their FLOPs)
        self.forwards = self.forward_steps = 0  # over the windows that count both
        self.own_steps = self.own_sent_bytes = 0  # over the windows with self-accounting
        self.main_waited = self.waited = self.workers_waited = 0  # windows that measure each wait
        self.compiled = self.compiles = self.recompiles = 0  # windows with torch.compile's figures, and their counts
        self.graph_breaks: SlidingMax[Window] = SlidingMax()  # a running count: the span's largest is its newest
        # Each window's compile time spent recompiling: in its recompiles' proportion of its compiles, or, in a
        # window with compile time and no compile (a backward compiled after its forward), the last such proportion.
        self.recompile_parts: deque[float] = deque()
        self.recompile_share = 0.0
        self.loader_fracs: deque[float] = deque()  # each window's loader wait share, for the error band
        self.gpu_p50s: list[float] = []  # sorted
        self.max_step: SlidingMax[Window] = SlidingMax()
        self.peak: SlidingMax[Window] = SlidingMax()
        self.dropped: SlidingMax[Window] = SlidingMax()
        self.slowest: SlidingMax[Window] = SlidingMax()  # the windows' slowest named steps, to skip the stall scan
        self.newest: dict[str, Window] = {}  # field (or "timed") -> the newest window that has it
        # DDP times every Nth iteration and a sample repeats in the windows until the next: each counts once.
        # By sample key: the newest window with it, how many windows have it, its sample once read.
        # Three dicts, not a list per key: a dict of windows and ints is not tracked by the GC (see DdpTimings).
        self.ddp: dict[int, Window] = {}
        self.ddp_windows: dict[int, int] = {}
        self.ddp_read: dict[int, DdpTimings] = {}

    @classmethod
    def of(cls, windows: Iterable[Window]) -> SpanSums:
        """The sums of ``windows``, oldest first."""
        sums = cls()
        for w in windows:
            sums.add(w)
        return sums

    def add(self, w: Window) -> None:
        """``w`` enters the span as its newest window."""
        self.parts.append(window_parts(w))
        self.phase_parts.append(tuple(getattr(w, name) or 0.0 if w.timed > 0 else 0.0 for name in TIMED_PHASES))
        if w.compiles:
            self.recompile_share = min((w.recompiles or 0) / w.compiles, 1.0)
        self.recompile_parts.append((w.compile_s or 0.0) * self.recompile_share)
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
        if w.graph_breaks is not None:
            self.graph_breaks.push(w.graph_breaks, w)
        if w.slow_steps:
            self.slowest.push(max(w.slow_steps)[0], w)
        for name in _NEWEST_FIELDS:
            if getattr(w, name) is not None:
                self.newest[name] = w
        if w.phases_from is not None:
            self.newest["phases_from"] = w
        if w.comm_s is not None:
            key = ddp_key(w)
            self.ddp[key] = w
            self.ddp_windows[key] = self.ddp_windows.get(key, 0) + 1
            self.ddp_read.pop(key, None)  # read again from the newest window

    def remove(self, w: Window) -> None:
        """``w``, the span's oldest window, leaves it."""
        self.parts.popleft()
        self.phase_parts.popleft()
        self.recompile_parts.popleft()
        self._count(w, -1)
        if w.timed > 0 and window_loader_wait_frac(w) is not None:
            self.loader_fracs.popleft()
        if w.gpu_step_time_p50_s is not None:
            del self.gpu_p50s[bisect.bisect_left(self.gpu_p50s, w.gpu_step_time_p50_s)]
        for queue in (self.max_step, self.peak, self.dropped, self.slowest, self.graph_breaks):
            queue.pop(w)
        newest = self.newest
        for name in (*_NEWEST_FIELDS, "timed", "phases_from"):
            if newest.get(name) is w:  # the newest with the field is the oldest: none other has it
                del newest[name]
        if w.comm_s is not None:
            key = ddp_key(w)
            if (n := self.ddp_windows[key]) > 1:  # newer windows repeat the sample: the newest stays
                self.ddp_windows[key] = n - 1
            else:
                del self.ddp[key], self.ddp_windows[key]
                self.ddp_read.pop(key, None)

    def ddp_timings(self) -> list[DdpTimings]:
        """The distinct samples in iteration order, however they came; each built once, when first read."""
        samples = []
        read = self.ddp_read
        for key, w in sorted(self.ddp.items()):  # keys are distinct: the windows are never compared
            sample = read.get(key)
            if sample is None:
                sample = read[key] = ddp_timings(w)
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
            for i, name in enumerate(TIMED_PHASES):
                if getattr(w, name) is not None:
                    self.phase_steps[i] += timed * sign
            sketch = self.sketch
            for bucket, count in (w.step_sketch or legacy_hist_to_sketch(w.step_hist)).items():
                if total := sketch.get(bucket, 0) + count * sign:
                    sketch[bucket] = total
                else:
                    del sketch[bucket]
        if w.flops_steps is not None:
            self.flops_steps += w.flops_steps * sign
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
        if w.compiles is not None:
            self.compiled += sign
            self.compiles += w.compiles * sign
            self.recompiles += (w.recompiles or 0) * sign
        if w.main_cpu_wait_s is not None:
            self.main_waited += sign
        if w.cpu_wait_s is not None and (w.cpu_run_s is not None or w.cpu_pct is not None):
            self.waited += sign
            if w.workers_cpu_wait_s is not None and w.workers_cpu_pct is not None:
                self.workers_waited += sign

    def stats(self, windows: Sequence[Window]) -> RankStats:
        """The figures of ``windows``, the span this holds (oldest first), group by group."""
        t = WindowParts(*map(sum, zip(*self.parts, strict=True))) if self.parts else NO_PARTS
        step = self._step_times(t)
        last = self._newest_reader()
        return RankStats(
            windows=len(windows),
            steps=count_steps(windows),
            dropped=int(self.dropped.value or 0),
            step=step,
            phases=self._phases(t, step.mean_s),
            memory=MemoryUse(
                allocated_bytes=last("mem_allocated_bytes"),
                reserved_bytes=last("mem_reserved_bytes"),
                peak_bytes=None if (peak := self.peak.value) is None else int(peak),
                total_bytes=last("mem_total_bytes"),
                alloc_retries=last("alloc_retries"),
                ooms=last("ooms"),
            ),
            cpu=self._cpu(t, last),
            stalls=self._stalls(windows, step.p50_s, t.step_s),
            compile=self._compile(t),
            cost=OwnCost(
                reporter_cpu_pct=100.0 * t.reporter_cpu_s / t.own_span_s if t.own_span_s > 0 else None,
                hook_s_per_step=t.hook_s / self.own_steps if self.own_steps else None,
                cpu_frac=t.gputop_cpu_s / t.rank_cpu_s if t.rank_cpu_s > 0 else None,
                sent_bytes_per_s=self.own_sent_bytes / t.own_span_s if t.own_span_s > 0 else None,
            ),
            work=StepWork(
                flops_per_step=t.flops / self.flops_steps if self.flops_steps else None,
                achieved_flops_per_s=t.flops / t.flops_time_s if self.flops_steps and t.flops_time_s > 0 else None,
            ),
            collectives=collective_figures(windows),
        )

    def _step_times(self, t: WindowParts) -> StepTimes:
        max_step = self.max_step.value
        if self.with_steps == 1:  # one window: its exact figures beat the histogram
            only = self.newest["timed"]
            p50, p95 = only.step_time_p50_s, only.step_time_p95_s
        else:
            # A bucket's value can lie above the slowest step in it: never report a p95 above the max.
            p50, p95 = (_at_most(q, max_step) for q in sketch_quantiles_s(self.sketch, (0.5, 0.95)))
        return StepTimes(
            per_s=self.steps / t.span_s if t.span_s > 0 else None,
            mean_s=t.step_s / self.timed if self.timed else None,
            p50_s=p50,
            p95_s=p95,
            max_s=max_step,
            gpu_p50_s=median(self.gpu_p50s),
            samples_per_s=self.samples / t.span_s if self.samples_seen and t.span_s > 0 else None,
        )

    def _phases(self, t: WindowParts, mean_step: float | None) -> PhaseTimes:
        ddp = DdpMeans.of(self.ddp_timings())
        micro = self.forwards / self.forward_steps if self.forward_steps and self.forwards else None
        newest = self.newest
        source = newest["phases_from"].phases_from if "phases_from" in newest else None
        # DDP times one micro-batch of a step; the hooks and the CUDA events time every forward and backward of it.
        scale = micro if micro is not None and micro > 1.0 and source not in ("hooks", "cuda events") else 1.0
        tracked = self.tracked > 0
        phase_totals = [sum(column) for column in zip(*self.phase_parts, strict=True)] or [0.0] * len(TIMED_PHASES)
        phases: dict[str, Any] = {
            "loader_wait_s": t.loader_s / self.timed if (self.timed and tracked) else None,
            "forward_s": _scaled(ddp.means["forward_s"], scale),
            "backward_s": _scaled(ddp.means["backward_s"], scale),
            "exposed_comm_s": ddp.means["exposed_comm_s"],
            **{
                name: total / steps if steps else None
                for name, total, steps in zip(TIMED_PHASES, phase_totals, self.phase_steps, strict=True)
            },
        }
        # An optional phase this rank does not measure keeps its time outside the phases.
        measured = {p.seconds: phases[p.seconds] for p in OWN_PHASES if phases[p.seconds] is not None or not p.optional}
        return PhaseTimes(
            **phases,
            loader_wait_frac=loader_wait_share(t.loader_s, t.step_s, tracked=tracked),
            micro_batches=micro,
            comm_s=ddp.means["comm_s"],
            overlap_s=ddp.means["overlap_s"],
            exposed_comm_frac=share_of_step(ddp.means["exposed_comm_s"], mean_step),
            loader_wait_frac_se=standard_error(self.loader_fracs),
            exposed_comm_frac_se=standard_error(ddp.exposed_comm_fracs),
            other_s=other_seconds(mean_step, {**measured, "exposed_comm_s": phases["exposed_comm_s"]}),
            source=source or ("ddp" if ddp.means["comm_s"] is not None else None),  # older reporters: DDP
        )

    def _newest_reader(self) -> Callable[[str], Any]:
        """A reader of a gauge: fields a probe fills together come from the newest window that probe filled."""
        newest = self.newest
        sources = [newest.get(group[0]) for group in NEWEST_GROUPS]

        def last(name: str) -> Any:
            for source in sources:
                if source is not None and getattr(source, name) is not None:
                    return getattr(source, name)
            newest_with = newest.get(name)  # a field its probe's usual partner left empty
            return None if newest_with is None else getattr(newest_with, name)

        return last

    def _cpu(self, t: WindowParts, last: Callable[[str], Any]) -> CpuUse:
        starved = self.waited > 0
        return CpuUse(
            pct=t.cpu_pct / self.cpu_n if self.cpu_n else None,
            rss_bytes=last("rss_bytes"),
            threads=last("threads"),
            workers=last("workers"),
            workers_pct=t.workers_cpu_pct / self.workers_cpu_n if self.workers_cpu_n else None,
            main_wait_frac=t.main_wait_s / t.main_span_s if self.main_waited and t.main_span_s > 0 else None,
            starved_frac=starved_share(t.wait_s + t.workers_wait_s, t.run_s + t.workers_run_s) if starved else None,
            workers_starved_frac=starved_share(t.workers_wait_s, t.workers_run_s) if self.workers_waited else None,
            demand_cores=(
                (t.wait_s + t.run_s + t.workers_wait_s + t.workers_run_s) / t.wait_span_s
                if starved and t.wait_span_s > 0
                else None
            ),
        )

    def _stalls(self, windows: Sequence[Window], p50: float | None, step_sum_s: float) -> StallFigures:
        if p50 is None or not self.sketch:
            return StallFigures()
        slowest = self.slowest.value
        named = windows if slowest is not None and slowest >= STALL_FACTOR * p50 else ()
        return stalls(named, self.sketch, p50, step_sum_s)

    def _compile(self, t: WindowParts) -> CompileFigures:
        graph_breaks = None if (breaks := self.graph_breaks.value) is None else int(breaks)
        if not self.compiled:
            return CompileFigures(graph_breaks=graph_breaks)
        recompile_s = sum(self.recompile_parts)
        return CompileFigures(
            compiles=self.compiles,
            recompiles=self.recompiles,
            seconds=t.compile_s,
            frac=min(t.compile_s / t.span_s, 1.0) if t.span_s > 0 else None,
            recompile_s=recompile_s,
            recompile_frac=min(recompile_s / t.span_s, 1.0) if t.span_s > 0 else None,
            graph_breaks=graph_breaks,
        )


def rank_stats(windows: Sequence[Window]) -> RankStats:
    """Summarise a rank's windows (oldest first): every figure as ``SpanSums`` defines it."""
    return SpanSums.of(windows).stats(windows)
