"""GPU time per step: CUDA events recorded at the step marks on the rank's device, read once they have completed."""

from __future__ import annotations

from typing import Any

from gputop.reporter.clock import StepMark
from gputop.reporter.rank_cuda import RankCuda
from gputop.reporter.window import percentile


class GpuStepProbe:
    """Elapsed GPU time between consecutive step events whose work has completed.

    The events and every CUDA call on them belong to ``RankCuda``; this probe
    only turns its step times into the window's figure.  Without a device (the
    model's GPU cannot be told) it measures nothing and ``not_measured`` says why.
    """

    name = "gpu_step_times"

    def __init__(self, device: RankCuda | None, *, not_measured: str | None = None) -> None:
        self._device = device
        self.not_measured = not_measured

    def read(self, marks: list[StepMark]) -> dict[str, Any]:
        if self._device is None:
            return {}
        gpu_times = self._device.step_times_s()
        if not gpu_times:
            return {}
        gpu_times.sort()
        return {"gpu_step_time_p50_s": percentile(gpu_times, 0.5)}
