"""GPU time per step: CUDA events recorded at the step marks, read once they have completed."""

from __future__ import annotations

from typing import Any

from gputop.reporter.clock import StepMark
from gputop.reporter.window import percentile

# A stream that never completes (a hung kernel) must not make us hold events forever.
MAX_PENDING_EVENTS = 10_000


class GpuStepProbe:
    """Elapsed GPU time between consecutive step marks whose events have completed.

    ``query()`` never blocks: an event not done yet waits for the next window,
    so the training thread is never synchronised with the GPU.
    """

    name = "gpu_step_times"

    def __init__(self) -> None:
        self._pending: list[Any] = []  # recorded events not known to be complete
        self._last: Any = None  # the newest completed event

    def read(self, marks: list[StepMark]) -> dict[str, Any]:
        self._pending.extend(m.cuda_event for m in marks if m.cuda_event is not None)
        gpu_times = []
        while self._pending and self._pending[0].query():
            event = self._pending.pop(0)
            if self._last is not None:
                gpu_times.append(self._last.elapsed_time(event) / 1000.0)
            self._last = event
        if len(self._pending) > MAX_PENDING_EVENTS:
            self._pending.clear()
        if not gpu_times:
            return {}
        gpu_times.sort()
        return {"gpu_step_time_p50_s": percentile(gpu_times, 0.5)}
