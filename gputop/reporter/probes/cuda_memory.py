"""The CUDA caching allocator's counters for the rank's device: allocated, reserved, peak, retries, OOMs."""

from __future__ import annotations

from typing import Any

from gputop.reporter.clock import StepMark
from gputop.reporter.rank_cuda import RankCuda


class CudaMemoryProbe:
    """``torch.cuda.memory_stats`` of the rank's device, read through ``RankCuda``: host-side counters, no sync."""

    name = "memory"
    not_measured: str | None = None

    def __init__(self, device: RankCuda, total_bytes: int | None) -> None:
        self._device = device
        self._total_bytes = total_bytes

    def read(self, marks: list[StepMark]) -> dict[str, Any]:
        stats = self._device.memory_stats()
        if not stats:
            return {}
        out = {
            "mem_allocated_bytes": int(stats.get("allocated_bytes.all.current", 0)),
            "mem_reserved_bytes": int(stats.get("reserved_bytes.all.current", 0)),
            "mem_peak_bytes": int(stats.get("allocated_bytes.all.peak", 0)),
            "alloc_retries": int(stats.get("num_alloc_retries", 0)),
            "ooms": int(stats.get("num_ooms", 0)),
        }
        if self._total_bytes:
            out["mem_total_bytes"] = self._total_bytes
        return out
