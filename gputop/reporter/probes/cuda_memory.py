"""The CUDA caching allocator's counters for the rank's device: allocated, reserved, peak, retries, OOMs."""

from __future__ import annotations

from typing import Any

from gputop.reporter.clock import StepMark


class CudaMemoryProbe:
    """``torch.cuda.memory_stats`` of one device: host-side counters, no GPU synchronisation."""

    name = "memory"

    def __init__(self, device: str, total_bytes: int | None) -> None:
        import torch

        self._torch = torch
        self._index = torch.device(device).index
        self._total_bytes = total_bytes

    def read(self, marks: list[StepMark]) -> dict[str, Any]:
        cuda = self._torch.cuda
        if not cuda.is_initialized():
            return {}
        stats = cuda.memory_stats(self._index)
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
