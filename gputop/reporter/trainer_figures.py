"""The figures a rank logs into its trainer's logger (TensorBoard, W&B, CSV): its own recent step breakdown.

Computed in the rank from its last windows (``RECENT_WINDOWS``, 10 s at the
default 0.5-s window), with the definitions the dashboard uses
(``gputop.model.stats``, which the reporter may not import): loader wait as a
share of step time, DDP's per-step phases as means weighted by the steps they
cover, exposed communication as communication not hidden behind backward.
Keys are ``gputop/rank<R>/<figure>``; a figure that was not measured is left
out, never logged as zero.
"""

from __future__ import annotations

from collections.abc import Sequence

from gputop.protocol import Window

RECENT_WINDOWS = 20


def _weighted(windows: Sequence[Window], field: str) -> float | None:
    pairs = [(getattr(w, field), w.ddp_steps or 1) for w in windows if getattr(w, field) is not None]
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else None


def figures(windows: Sequence[Window], rank: int) -> dict[str, float]:
    """This rank's step breakdown over ``windows`` (its most recent ones), as logger keys."""
    if not windows:
        return {}
    out: dict[str, float] = {}
    timed = sum(w.timed for w in windows)
    step_sum_s = sum(w.step_time_sum_s for w in windows)
    span_s = sum(w.duration_s for w in windows)
    out["steps_per_s"] = sum(w.steps for w in windows) / span_s
    if timed and step_sum_s > 0:
        out["step_time_ms"] = step_sum_s / timed * 1e3
        out["loader_wait_pct"] = min(sum(w.loader_wait_s for w in windows) / step_sum_s, 1.0) * 100
    for field in ("forward_s", "backward_s", "comm_s"):
        value = _weighted(windows, field)
        if value is not None:
            out[field.replace("_s", "_ms")] = value * 1e3
    exposed = [(w.exposed_comm_s, w.ddp_steps or 1) for w in windows if w.exposed_comm_s is not None]
    if exposed:
        out["exposed_comm_ms"] = sum(v * n for v, n in exposed if v is not None) / sum(n for _, n in exposed) * 1e3
        if "step_time_ms" in out:
            out["exposed_comm_pct"] = min(out["exposed_comm_ms"] / out["step_time_ms"], 1.0) * 100
    cpu = [w.cpu_pct for w in windows if w.cpu_pct is not None]
    if cpu:
        out["cpu_pct"] = sum(cpu) / len(cpu)
    return {f"gputop/rank{rank}/{key}": round(value, 4) for key, value in out.items()}
