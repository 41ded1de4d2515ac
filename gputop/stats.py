"""Per-rank figures over a span of windows: pure arithmetic on protocol windows.

The dashboard, the report and the diagnosis rules all read a rank through
``rank_stats`` so that "loader wait %" means the same thing everywhere:
time blocked in the tracked loader's ``next()`` divided by wall step time,
over the steps that ended inside the span.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gputop.protocol import Window, hist_quantile_s


@dataclass(frozen=True)
class RankStats:
    """A rank over a span of windows.  None means not measured (N/A)."""

    windows: int
    span_s: float
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
    forward_s: float | None  # per step, DDP sample
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

    @property
    def other_s(self) -> float | None:
        """Step time not explained by loader wait, compute or exposed comm."""
        parts = (self.loader_wait_s, self.forward_s, self.backward_s, self.exposed_comm_s)
        if self.step_time_mean_s is None or any(p is None for p in parts):
            return None
        return max(self.step_time_mean_s - sum(p for p in parts if p is not None), 0.0)


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _last(values: Sequence[int | float | None]) -> int | float | None:
    for value in reversed(values):
        if value is not None:
            return value
    return None


def _median(values: Sequence[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def count_steps(windows: Sequence[Window]) -> int:
    """Steps made across the windows, robust to windows lost in between.

    Uses the cumulative ``step_total``: last total minus the total before the
    first window.  Equals the sum of ``steps`` when no window went missing.
    """
    if not windows:
        return 0
    first, last = windows[0], windows[-1]
    return max(last.step_total - (first.step_total - first.steps), 0)


def rank_stats(windows: Sequence[Window]) -> RankStats:
    """Summarise a rank's windows (oldest first)."""
    steps = count_steps(windows)
    span_s = (windows[-1].t1 - windows[0].t0) if windows else 0.0
    with_steps = [w for w in windows if w.steps > 0]
    step_sum_s = sum(w.step_time_sum_s for w in with_steps)
    step_count = sum(w.steps for w in with_steps)
    mean_step = step_sum_s / step_count if step_count else None

    hist: dict[int, int] = {}
    for w in with_steps:
        for bucket, count in w.step_hist.items():
            hist[bucket] = hist.get(bucket, 0) + count
    if len(with_steps) == 1:  # one window: its exact figures beat the histogram's
        p50, p95 = with_steps[0].step_time_p50_s, with_steps[0].step_time_p95_s
    else:
        p50, p95 = hist_quantile_s(hist, 0.5), hist_quantile_s(hist, 0.95)
    maxes = [w.step_time_max_s for w in with_steps if w.step_time_max_s is not None]

    loader_total = sum(w.loader_wait_s for w in with_steps)
    tracked = any(w.loader_batches for w in windows)
    loader_per_step = loader_total / step_count if (step_count and tracked) else None
    loader_frac = loader_total / step_sum_s if (step_sum_s > 0 and tracked) else None

    ddp = [w for w in windows if w.comm_s is not None]
    exposed = _mean(w.exposed_comm_s for w in ddp)
    samples = [w.samples for w in windows if w.samples is not None]
    active_span = sum(w.duration_s for w in windows)

    return RankStats(
        windows=len(windows),
        span_s=span_s,
        steps=steps,
        steps_per_s=step_count / active_span if active_span > 0 and windows else None,
        step_time_mean_s=mean_step,
        step_time_p50_s=p50,
        step_time_p95_s=p95,
        step_time_max_s=max(maxes) if maxes else None,
        gpu_step_time_p50_s=_median([w.gpu_step_time_p50_s for w in windows if w.gpu_step_time_p50_s is not None]),
        samples_per_s=sum(samples) / active_span if samples and active_span > 0 else None,
        loader_wait_s=loader_per_step,
        loader_wait_frac=loader_frac,
        forward_s=_mean(w.forward_s for w in ddp),
        backward_s=_mean(w.backward_s for w in ddp),
        comm_s=_mean(w.comm_s for w in ddp),
        overlap_s=_mean(w.overlap_s for w in ddp),
        exposed_comm_s=exposed,
        exposed_comm_frac=(exposed / mean_step) if (exposed is not None and mean_step) else None,
        mem_allocated_bytes=_last([w.mem_allocated_bytes for w in windows]),  # type: ignore[arg-type]
        mem_reserved_bytes=_last([w.mem_reserved_bytes for w in windows]),  # type: ignore[arg-type]
        mem_peak_bytes=max((w.mem_peak_bytes for w in windows if w.mem_peak_bytes is not None), default=None),
        mem_total_bytes=_last([w.mem_total_bytes for w in windows]),  # type: ignore[arg-type]
        alloc_retries=_last([w.alloc_retries for w in windows]),  # type: ignore[arg-type]
        ooms=_last([w.ooms for w in windows]),  # type: ignore[arg-type]
        cpu_pct=_mean(w.cpu_pct for w in windows),
        rss_bytes=_last([w.rss_bytes for w in windows]),  # type: ignore[arg-type]
        threads=_last([w.threads for w in windows]),  # type: ignore[arg-type]
        workers=_last([w.workers for w in windows]),  # type: ignore[arg-type]
        workers_cpu_pct=_mean(w.workers_cpu_pct for w in windows),
        dropped=max((w.dropped for w in windows), default=0),
    )


def recent(windows: Sequence[Window], span_s: float) -> list[Window]:
    """The windows that ended within ``span_s`` of the newest one."""
    if not windows:
        return []
    cutoff = windows[-1].t1 - span_s
    return [w for w in windows if w.t1 > cutoff]
