"""Merging consecutive windows of one rank into one: how a long recording keeps its size.

Pure.  The merged window means what a reporter would have sent had its window
been that long, for every figure the dashboard and the report read: totals add
(steps, step and loader time, samples, forwards, run-queue waits, gputop's own
cost), the step-time sketch adds bucket by bucket, the slowest steps stay the
slowest of all, DDP's per-step figures are means weighted by the
iterations each window averaged, CPU shares are means weighted by duration,
cumulative and point-in-time readings (step_total, memory, allocator retries,
RSS, threads, workers, drops) take the newest, peaks the largest.  The windows'
own p50/p95 become step-weighted means of theirs: the sketch keeps the exact
shape for the quantiles computed from it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from gputop.protocol import SLOW_STEPS_KEPT, Window


def _weighted(
    ws: Sequence[Window], read: Callable[[Window], float | None], weight: Callable[[Window], float]
) -> float | None:
    total = mass = 0.0
    for w in ws:
        value = read(w)
        if value is not None:
            total += value * weight(w)
            mass += weight(w)
    return total / mass if mass else None


def _newest(ws: Sequence[Window], read: Callable[[Window], int | None]) -> int | None:
    for w in reversed(ws):
        value = read(w)
        if value is not None:
            return value
    return None


def _sum_or_none(values: Sequence[float | int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


def merge_windows(ws: Sequence[Window]) -> Window:
    """One window covering ``ws`` (one rank's, oldest first, at least one)."""
    if len(ws) == 1:
        return ws[0]
    first, last = ws[0], ws[-1]
    hist: Counter[int] = Counter()
    sketch: Counter[int] = Counter()
    for w in ws:
        hist.update(w.step_hist)
        sketch.update(w.step_sketch)
    # Each slow step with its number (0 where an older reporter sent none), the slowest kept.
    numbered = all(len(w.slow_step_numbers) == len(w.slow_steps) for w in ws)
    pairs = [(step, w.slow_step_numbers[i] if numbered else 0) for w in ws for i, step in enumerate(w.slow_steps)]
    slowest = sorted(pairs, key=lambda pair: pair[0], reverse=True)[:SLOW_STEPS_KEPT]
    timed = sum(w.timed for w in ws)
    ddp = [w for w in ws if w.ddp_iteration is not None or w.forward_s is not None or w.comm_s is not None]
    ddp_weight: Callable[[Window], float] = lambda w: float(w.ddp_steps or 1)  # noqa: E731
    steps_weight: Callable[[Window], float] = lambda w: float(w.steps)  # noqa: E731
    duration: Callable[[Window], float] = lambda w: w.duration_s  # noqa: E731
    samples = _sum_or_none([w.samples for w in ws])
    peaks = [w.mem_peak_bytes for w in ws if w.mem_peak_bytes is not None]
    maxima = [w.step_time_max_s for w in ws if w.step_time_max_s is not None]
    sent = _sum_or_none([w.sent_bytes for w in ws])
    return Window(
        run_id=last.run_id,
        rank=last.rank,
        seq=last.seq,
        t0=first.t0,
        t1=last.t1,
        steps=sum(w.steps for w in ws),
        step_total=last.step_total,
        timed_steps=timed if timed != sum(w.steps for w in ws) else None,
        step_time_sum_s=sum(w.step_time_sum_s for w in ws),
        step_time_p50_s=_weighted(ws, lambda w: w.step_time_p50_s, steps_weight),
        step_time_p95_s=_weighted(ws, lambda w: w.step_time_p95_s, steps_weight),
        step_time_max_s=max(maxima) if maxima else None,
        step_sketch=dict(sketch),
        slow_steps=tuple(step for step, _ in slowest),
        slow_step_numbers=tuple(number for _, number in slowest) if numbered else (),
        step_hist=dict(hist),
        gpu_step_time_p50_s=_weighted(ws, lambda w: w.gpu_step_time_p50_s, steps_weight),
        loader_wait_s=sum(w.loader_wait_s for w in ws),
        loader_batches=sum(w.loader_batches for w in ws),
        samples=int(samples) if samples is not None else None,
        forwards=_int_or_none(_sum_or_none([w.forwards for w in ws])),
        forward_s=_weighted(ddp, lambda w: w.forward_s, ddp_weight),
        backward_s=_weighted(ddp, lambda w: w.backward_s, ddp_weight),
        comm_s=_weighted(ddp, lambda w: w.comm_s, ddp_weight),
        overlap_s=_weighted(ddp, lambda w: w.overlap_s, ddp_weight),
        ddp_iteration=_newest(ddp, lambda w: w.ddp_iteration),
        ddp_steps=sum(w.ddp_steps or 1 for w in ddp) if ddp else None,
        mem_allocated_bytes=_newest(ws, lambda w: w.mem_allocated_bytes),
        mem_reserved_bytes=_newest(ws, lambda w: w.mem_reserved_bytes),
        mem_peak_bytes=max(peaks) if peaks else None,
        mem_total_bytes=_newest(ws, lambda w: w.mem_total_bytes),
        alloc_retries=_newest(ws, lambda w: w.alloc_retries),
        ooms=_newest(ws, lambda w: w.ooms),
        cpu_pct=_weighted(ws, lambda w: w.cpu_pct, duration),
        rss_bytes=_newest(ws, lambda w: w.rss_bytes),
        threads=_newest(ws, lambda w: w.threads),
        workers=_newest(ws, lambda w: w.workers),
        workers_cpu_pct=_weighted(ws, lambda w: w.workers_cpu_pct, duration),
        main_cpu_wait_s=_sum_or_none([w.main_cpu_wait_s for w in ws]),
        cpu_wait_s=_sum_or_none([w.cpu_wait_s for w in ws]),
        cpu_run_s=_sum_or_none([w.cpu_run_s for w in ws]),
        workers_cpu_wait_s=_sum_or_none([w.workers_cpu_wait_s for w in ws]),
        dropped=last.dropped,
        reporter_cpu_s=_sum_or_none([w.reporter_cpu_s for w in ws]),
        hook_s=_sum_or_none([w.hook_s for w in ws]),
        sent_bytes=int(sent) if sent is not None else None,
    )
