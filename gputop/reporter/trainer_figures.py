"""The figures a rank logs into its trainer's logger (TensorBoard, W&B, CSV): its own recent step breakdown.

Computed in the rank from its last windows (``RECENT_WINDOWS``, 10 s at the
default 1-s window), merged by the rules the dashboard's span follows
(``gputop.combine``, which the reporter and the model both import): loader wait
as a share of step time, each phase in milliseconds a step, exposed
communication as communication not hidden behind backward.
Keys are ``gputop/rank<R>/<figure>``; a figure that was not measured is left
out, never logged as zero.  The run's findings come from the dashboard
(``FindingsNotice``) as ``gputop/finding/<cause>``: 0 none, 1 info, 2 warn,
3 critical; a cause seen once is logged 0 after it clears, so its chart drops.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from gputop.combine import merge_windows, window_loader_wait_frac, window_phase_seconds
from gputop.protocol import FindingsNotice, Window

RECENT_WINDOWS = 10


def figures(windows: Sequence[Window], rank: int, peak_flops: float | None = None) -> dict[str, float]:
    """This rank's step breakdown over ``windows`` (its most recent ones), as logger keys.

    The windows are merged as a recording merges them (``gputop.combine``), so each
    figure combines by the rule the dashboard's span uses, and each phase of
    ``gputop.combine.PHASES`` the rank measures is logged as ``<phase>_ms``.  The work
    a step does where it was counted (docs/mfu.md): ``gflop_per_step``, ``tflops`` (the
    FLOP/s achieved, in TFLOP/s) and, against ``peak_flops``, ``mfu_pct``.
    """
    if not windows:
        return {}
    merged = merge_windows(windows)
    out: dict[str, float] = {"steps_per_s": merged.steps / merged.duration_s}
    step_s = merged.step_time_mean_s
    if step_s:
        out["step_time_ms"] = step_s * 1e3
        loader = window_loader_wait_frac(merged)
        if loader is not None:
            out["loader_wait_pct"] = min(loader, 1.0) * 100
    for name, seconds in window_phase_seconds(merged).items():
        if seconds is not None and name != "loader":
            out[f"{name}_ms"] = seconds * 1e3
    if merged.comm_s is not None:
        out["comm_ms"] = merged.comm_s * 1e3
    if step_s and merged.exposed_comm_s is not None:
        out["exposed_comm_pct"] = min(merged.exposed_comm_s / step_s, 1.0) * 100
    if merged.cpu_pct is not None:
        out["cpu_pct"] = merged.cpu_pct
    if merged.flops_sum and merged.flops_steps and merged.flops_time_s:
        achieved = merged.flops_sum / merged.flops_time_s
        out["gflop_per_step"] = merged.flops_sum / merged.flops_steps / 1e9
        out["tflops"] = achieved / 1e12
        if peak_flops:
            out["mfu_pct"] = achieved / peak_flops * 100
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
        self.peak_flops: float | None = None  # the device's peak for the rank's step (gputop.peaks.rank_peak)

    def figures(self, rank: int) -> dict[str, float]:
        """The rank's breakdown and, once a dashboard said what it finds, its run's findings."""
        values = figures(tuple(self.recent), rank, self.peak_flops)
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
