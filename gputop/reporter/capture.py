"""Profiler capture on demand: torch.profiler over a rank's next N steps, asked for from the dashboard.

The dashboard sends a ``CaptureRequest`` (the only command a reporter obeys:
fixed fields, never code).  The reporter thread arms a ``ProfilerCapture``;
the training thread, at its next step mark, starts ``torch.profiler``, and
after N more marks stops it.  Those two calls, and the profiler's own cost
during the N steps, are all the training thread pays; writing the
Chrome/Perfetto trace and ranking the operators happen on the reporter thread
afterwards.  Stopping the profiler synchronises a CUDA device once, as
``torch.profiler`` always does.  Anything that fails ends the capture with a
result that says why; training goes on as before.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from gputop import settings
from gputop.protocol import TOP_OPS, CaptureRequest, CaptureResult, OpTime

ARMED, RUNNING, DONE, FAILED = "armed", "running", "done", "failed"
ARMED_TIMEOUT_S = 120.0  # a rank that takes no step in 2 minutes is not training: give up, say so


def trace_dir() -> Path:
    """Where traces go: ``GPUTOP_TRACE_DIR``, else a per-user folder under the system's temp dir."""
    return settings.TRACE_DIR.value() or Path(tempfile.gettempdir()) / f"gputop-traces-{os.getuid()}"


class ProfilerCapture:
    """One capture on one rank.  ``on_step`` on the training thread; the rest on the reporter thread."""

    def __init__(self, request: CaptureRequest, *, run_id: str, rank: int, device: str | None) -> None:
        self.request = request
        self.run_id = run_id
        self.rank = rank
        self.device = device or ""
        self.state = ARMED
        self.error = ""
        self.armed_s = time.monotonic()
        self._steps_seen = 0
        self._started_s = 0.0
        self._stopped_s = 0.0
        self._profiler: Any = None
        self._lock = threading.Lock()  # the training thread's start/stop against the reporter's give-up

    # -- training thread ------------------------------------------------------------

    def on_step(self) -> None:
        """A step ended: start the profiler at the first, stop it N steps later.  Never raises."""
        if self.state not in (ARMED, RUNNING) or not self._lock.acquire(blocking=False):
            return
        try:
            if self.state == ARMED:
                self._start()
            elif self.state == RUNNING:
                self._steps_seen += 1
                if self._steps_seen >= self.request.steps:
                    self._stopped_s = time.perf_counter()
                    with self._on_model_device():  # stop() synchronises the current device: the model's, no other
                        self._profiler.stop()
                    self.state = DONE
        except Exception as exc:
            self.error = f"torch.profiler failed: {type(exc).__name__}: {exc}"
            self.state = FAILED
        finally:
            self._lock.release()

    def _start(self) -> None:
        import torch.profiler as tp

        activities = [tp.ProfilerActivity.CPU]
        if self.device.startswith("cuda"):
            activities.append(tp.ProfilerActivity.CUDA)
        profiler = tp.profile(activities=activities, record_shapes=False, with_stack=False)
        with self._on_model_device():
            profiler.start()
        self._profiler = profiler
        self._started_s = time.perf_counter()
        self.state = RUNNING

    def _on_model_device(self) -> contextlib.AbstractContextManager[Any]:
        """The model's GPU current: torch.profiler synchronises (and on first use initialises) the current device,
        which for a script that placed its model without ``set_device`` is GPU 0, another rank's (a context there)."""
        kind, _, index = self.device.partition(":")
        if kind != "cuda" or not index.isdigit():
            return contextlib.nullcontext()
        import torch

        scope: contextlib.AbstractContextManager[Any] = torch.cuda.device(int(index))
        return scope

    # -- reporter thread ------------------------------------------------------------

    def give_up_if_stale(self, now_s: float) -> None:
        """No step since the capture was armed: end it (a profiler never started costs nothing)."""
        with self._lock:
            if self.state == ARMED and now_s - self.armed_s > ARMED_TIMEOUT_S:
                self.error = f"no training step in {ARMED_TIMEOUT_S:.0f} s; is the rank still training?"
                self.state = FAILED

    @property
    def finished(self) -> bool:
        return self.state in (DONE, FAILED)

    def result(self) -> CaptureResult:
        """The trace written and the operators ranked (for a finished capture), or why not."""
        if self.state != DONE:
            return self._failed(self.error or f"capture {self.state}")
        try:
            path = self._write_trace()
            top = top_ops(self._profiler.key_averages())
        except Exception as exc:
            return self._failed(f"writing the trace failed: {type(exc).__name__}: {exc}")
        return CaptureResult(
            run_id=self.run_id,
            rank=self.rank,
            id=self.request.id,
            t=time.time(),
            ok=True,
            steps=self.request.steps,
            wall_s=max(self._stopped_s - self._started_s, 0.0),
            trace_path=str(path),
            top_ops=top,
        )

    def _failed(self, why: str) -> CaptureResult:
        return CaptureResult(run_id=self.run_id, rank=self.rank, id=self.request.id, t=time.time(), ok=False, error=why)

    def _write_trace(self) -> Path:
        folder = trace_dir()
        folder.mkdir(parents=True, exist_ok=True)
        # "*.pt.trace.json" is what TensorBoard's profiler plugin and Holistic Trace Analysis look for.
        safe_run = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.run_id)[:80]
        path = folder / f"{safe_run}-rank{self.rank}-{self.request.id}.pt.trace.json"
        self._profiler.export_chrome_trace(str(path))
        return path


def top_ops(averages: Any, n: int = TOP_OPS) -> tuple[OpTime, ...]:
    """The n operators with the most self CPU time, then any of the n with the most self device time."""
    rows = []
    for avg in averages:
        device_us = getattr(avg, "self_device_time_total", None)
        if device_us is None:
            device_us = getattr(avg, "self_cuda_time_total", None)
        rows.append(
            OpTime(
                name=str(avg.key)[:200],
                calls=int(avg.count),
                self_cpu_s=max(float(avg.self_cpu_time_total), 0.0) / 1e6,
                self_device_s=None if not device_us else max(float(device_us), 0.0) / 1e6,
            )
        )
    by_cpu = sorted(rows, key=lambda r: -r.self_cpu_s)[:n]
    by_device = sorted((r for r in rows if r.self_device_s), key=lambda r: -(r.self_device_s or 0.0))[:n]
    chosen = {r.name: r for r in by_cpu}
    for r in by_device:
        chosen.setdefault(r.name, r)
    return tuple(chosen.values())


def torch_profiler_available() -> str:
    """ "" when torch.profiler can run here, else why not."""
    if "torch" not in sys.modules:
        return "torch is not imported in this process"
    try:
        import torch.profiler  # noqa: F401
    except Exception as exc:
        return f"torch.profiler is unavailable: {exc}"
    return ""
