"""How busy a GPU's SMs and tensor cores were, from GPM (Hopper and newer): between two samples.

``util_pct`` says only that a kernel ran; GPM's metrics say what share of the
SMs, and of the tensor cores, was active.  They are computed from two sample
buffers the driver fills, so the first sample of a device has nothing to
compare with (``GPM_WARMING_UP``), each later one compares with the buffer
kept from the last, and every buffer is freed once compared, when its GPU is
lost, or at ``close``.  Whether a device supports GPM is asked once.
"""

from __future__ import annotations

from typing import Any

from gputop.collect.gpu.nvml import GPU_LOST, DeviceReads, Nvml

# NVML enums, as fallbacks for a pynvml that lacks the names (values from nvml.h).
_CONSTANTS = {
    "NVML_GPM_METRIC_SM_UTIL": 2,
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 5,
    "NVML_GPM_METRICS_GET_VERSION": 1,
    "NVML_SUCCESS": 0,
}

GPM_NOT_SUPPORTED = "GPM not supported on this GPU (Hopper and newer only)"
GPM_WARMING_UP = "GPM needs two samples"


class GpmReader:
    """``sm_active_pct`` and ``tensor_active_pct`` per device, keeping each device's previous sample buffer."""

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        self._supported: dict[str, bool] = {}
        self._previous: dict[str, Any] = {}  # device -> the previous GPM sample buffer

    def read(self, reads: DeviceReads) -> dict[str, Any]:
        """SM and tensor activity between the previous sample and this one (N/A reasons in ``reads.na``)."""
        device = reads.device
        supported = self._supported.get(device)
        missing = None
        if supported is None and not reads.lost:
            support = reads.get("gpm", "nvmlGpmQueryDeviceSupport", record=False)
            supported = bool(support is not None and getattr(support, "isSupportedDevice", 0))
            if support is None and self.nvml.is_missing("nvmlGpmQueryDeviceSupport"):
                missing = "GPM: not in this driver (R520 and newer)"
            else:
                self._supported[device] = supported
        if not supported or reads.lost:
            reason = GPU_LOST if reads.lost else missing or GPM_NOT_SUPPORTED
            reads.na["sm_active_pct"] = reads.na["tensor_active_pct"] = reason
            return {}
        current, why = self.nvml.call("nvmlGpmSampleAlloc")
        if current is None:
            reads.na["sm_active_pct"] = reads.na["tensor_active_pct"] = f"GPM: {why}"
            return {}
        _, why = self.nvml.call("nvmlGpmSampleGet", reads.handle, current)
        if why is not None:
            self.nvml.call("nvmlGpmSampleFree", current)
            reads.na["sm_active_pct"] = reads.na["tensor_active_pct"] = f"GPM: {why}"
            return {}
        previous = self._previous.pop(device, None)
        self._previous[device] = current
        if previous is None:
            reads.na["sm_active_pct"] = reads.na["tensor_active_pct"] = GPM_WARMING_UP
            return {}
        out: dict[str, Any] = {}
        try:
            out = self._metrics(reads, previous, current)
        finally:
            self.nvml.call("nvmlGpmSampleFree", previous)
        return out

    def forget(self, device: str) -> None:
        """A lost GPU: free its buffer and ask again whether it supports GPM (a reset may change it)."""
        self._supported.pop(device, None)
        stale = self._previous.pop(device, None)
        if stale is not None:
            self.nvml.call("nvmlGpmSampleFree", stale)

    def drop_buffers(self) -> None:
        """A new NVML session: the buffers belong to the last one (not freed: that session is gone)."""
        self._previous.clear()

    def close(self) -> None:
        """Free every buffer kept."""
        for buffer in self._previous.values():
            self.nvml.call("nvmlGpmSampleFree", buffer)
        self._previous.clear()

    def _metrics(self, reads: DeviceReads, previous: Any, current: Any) -> dict[str, Any]:
        lib = self.nvml.lib
        wanted = (
            ("sm_active_pct", self._c("NVML_GPM_METRIC_SM_UTIL")),
            ("tensor_active_pct", self._c("NVML_GPM_METRIC_ANY_TENSOR_UTIL")),
        )
        request = lib.c_nvmlGpmMetricsGet_t()
        request.version = self._c("NVML_GPM_METRICS_GET_VERSION")
        request.numMetrics = len(wanted)
        request.sample1 = previous
        request.sample2 = current
        for i, (_, metric_id) in enumerate(wanted):
            request.metrics[i].metricId = metric_id
        result, why = self.nvml.call("nvmlGpmMetricsGet", request)
        out: dict[str, Any] = {}
        for i, (field, _) in enumerate(wanted):
            if result is None:
                reads.na[field] = f"GPM: {why}"
            elif result.metrics[i].nvmlReturn != self._c("NVML_SUCCESS"):
                reads.na[field] = f"GPM: NVML error {result.metrics[i].nvmlReturn}"
            else:
                out[field] = float(result.metrics[i].value)
        return out

    def _c(self, name: str) -> int:
        return self.nvml.constant(name, _CONSTANTS[name])
