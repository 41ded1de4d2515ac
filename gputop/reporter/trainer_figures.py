"""The figures a rank logs into its trainer's logger (TensorBoard, W&B, CSV): its own recent step breakdown.

Computed in the rank from its last windows (``RECENT_WINDOWS``, 10 s at the
default 0.5-s window), with the definitions the dashboard uses
(``gputop.model.stats``, which the reporter may not import): loader wait as a
share of step time, DDP's per-step phases as means weighted by the steps they
cover, exposed communication as communication not hidden behind backward.
Keys are ``gputop/rank<R>/<figure>``; a figure that was not measured is left
out, never logged as zero.  The run's findings come from the dashboard
(``FindingsNotice``) as ``gputop/finding/<cause>``: 0 none, 1 info, 2 warn,
3 critical; a cause seen once is logged 0 after it clears, so its chart drops.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from gputop.protocol import FindingsNotice, Window

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


class TrainerLog:
    """What a rank logs: its recent windows and its run's findings, and the writers ``log_to`` was given.

    The reporter thread appends windows and sets ``findings``; ``figures`` may
    be called from any thread (the trainer callbacks call it on the training
    thread at their logging steps).
    """

    def __init__(self) -> None:
        self.recent: deque[Window] = deque(maxlen=RECENT_WINDOWS)
        self.findings: FindingsNotice | None = None  # what the dashboard last said about this run
        self._writers: list[tuple[Any, float]] = []  # (TensorBoard-like writer, every_s)
        self._next_write_s = 0.0
        self._findings_written: FindingsNotice | None = None
        self._causes_seen: set[str] = set()

    def figures(self, rank: int) -> dict[str, float]:
        """The rank's breakdown and, once a dashboard said what it finds, its run's findings."""
        values = figures(tuple(self.recent), rank)
        notice = self.findings
        if notice is not None:
            worst: dict[str, int] = {}
            for finding in notice.findings:
                level = ("info", "warn", "critical").index(finding.severity) + 1
                worst[finding.cause] = max(worst.get(finding.cause, 0), level)
            self._causes_seen |= set(worst)
            values.update({f"gputop/finding/{cause}": float(worst.get(cause, 0)) for cause in self._causes_seen})
        return values

    def findings_text(self) -> str:
        """The run's findings as the dashboard last reported them, one line each ("" before any)."""
        notice = self.findings
        if notice is None:
            return ""
        return "\n".join(f"- **{f.severity}** {f.cause}: {f.title}" for f in notice.findings) or "no findings"

    def add_writer(self, writer: Any, every_s: float) -> None:
        self._writers = [*self._writers, (writer, every_s)]

    def write_due(self, rank: int, step: int, now_s: float) -> None:
        """Write the figures (and changed findings, as text) to every writer, if their time has come."""
        if not self._writers or now_s < self._next_write_s:
            return
        self._next_write_s = now_s + min(every for _, every in self._writers)
        values = self.figures(rank)
        notice, text = self.findings, ""
        if notice is not None and notice is not self._findings_written:
            self._findings_written, text = notice, self.findings_text()
        for writer, _ in self._writers:
            for tag, value in values.items():
                writer.add_scalar(tag, value, global_step=step)
            if text:
                writer.add_text("gputop/findings", text, global_step=step)
