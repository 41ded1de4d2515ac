"""A window's part of a rank's float totals (``WindowParts``), as ``SpanSums`` keeps one for each of its windows.

Floats are summed afresh from these parts when the figures are read, in window order,
never by taking away what left: a value that entered and left would leave its rounding
behind, and a total that should be 0 ("no CPU used") would not be.
"""

from __future__ import annotations

from typing import NamedTuple

from gputop.protocol import Window


class WindowParts(NamedTuple):
    """A window's part of each float total: 0.0 where it does not count towards one."""

    step_s: float  # wall step time, over the windows with timed steps
    loader_s: float  # loader wait, over the same
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
    compile_s: float  # torch.compile's time, over the windows that report it
    # The work of the steps whose FLOPs were counted (docs/mfu.md): their FLOPs and the time they took.
    flops: float
    flops_time_s: float


NO_PARTS = WindowParts(*[0.0] * len(WindowParts._fields))


def window_parts(w: Window) -> tuple[float, ...]:
    """The window's ``WindowParts``, kept as a plain tuple (see ``DdpTimings``: a span holds one a window)."""
    dt = w.t1 - w.t0
    timed = w.timed > 0
    own = w.reporter_cpu_s is not None and w.hook_s is not None
    # The compute threads' own CPU time where the reporter measures it, else the process's.
    run_s = w.cpu_run_s if w.cpu_run_s is not None else (None if w.cpu_pct is None else w.cpu_pct / 100.0 * dt)
    waited = w.cpu_wait_s is not None and run_s is not None
    workers = waited and w.workers_cpu_wait_s is not None and w.workers_cpu_pct is not None
    return tuple(
        WindowParts(
            step_s=w.step_time_sum_s if timed else 0.0,
            loader_s=w.loader_wait_s if timed else 0.0,
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
            compile_s=w.compile_s or 0.0,
            flops=w.flops_sum or 0.0,
            flops_time_s=w.flops_time_s or 0.0 if w.flops_sum is not None else 0.0,
        )
    )
