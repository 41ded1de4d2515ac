"""A fake NVML backend with pynvml's names, configured by scenario, for tests without a GPU.

``FakeNvml`` is what ``Nvml(backend=...)`` expects: pynvml's functions,
constants and ``NVMLError`` (with ``.value`` as in pynvml).  Each ``FakeGpu``
says what the device answers, which functions it refuses as NotSupported, and
whether it is lost; ``calls`` records every call so tests can check what was
(not) asked.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999


class NVMLError(Exception):
    """Like pynvml's: the NVML return code is in ``.value``."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"fake NVML error {self.value}"


@dataclass
class FakeProcess:
    pid: int
    used_bytes: int | None = 1 << 30


@dataclass
class FakeGpu:
    """One device: its answers, and how it misbehaves."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    util_pct: int = 50
    mem_util_pct: int = 20
    mem_used_bytes: int = 10 << 30
    mem_total_bytes: int = 80 << 30
    power_mw: int = 300_000
    power_limit_mw: int = 700_000
    temp_c: int = 60
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    pcie_rx_kib_s: int = 1000
    pcie_tx_kib_s: int = 500
    clock_event_mask: int = 0
    ecc_uncorrected: int = 0
    processes: list[FakeProcess] = field(default_factory=list)
    # (pid, timestamp_us, sm_util, mem_util): NVML's per-process sample buffer
    util_samples: list[tuple[int, int, int, int]] = field(default_factory=list)
    unsupported: set[str] = field(default_factory=set)  # function names answering NotSupported
    lost: bool = False
    mig: list[FakeGpu] | None = None  # MIG mode on, with these instances (None = MIG off)
    mig_capable: bool = False
    gpm: tuple[float, float] | None = None  # (sm_active_pct, tensor_active_pct) on a GPM device


@dataclass(frozen=True)
class Handle:
    gpu: FakeGpu


class MetricsGet:
    """Stands in for pynvml's c_nvmlGpmMetricsGet_t."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(8)]


class FakeNvml:
    """The backend: pynvml's function names over a list of ``FakeGpu``."""

    NVMLError = NVMLError
    c_nvmlGpmMetricsGet_t = MetricsGet

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        init_error: int | None = None,
        missing: set[str] | None = None,
        driver_version: str = "550.54.15",
    ) -> None:
        self.gpus = gpus if gpus is not None else []
        self.init_error = init_error
        self.missing = missing or set()  # functions this "driver" lacks: FUNCTION_NOT_FOUND
        self.driver_version = driver_version
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.initialized = False
        self.gpm_samples_live = 0
        # pynvml's constants, under their pynvml names
        for name, value in globals().items():
            if name.startswith("NVML_"):
                setattr(self, name, value)
        self.NVML_TEMPERATURE_GPU = 0
        self.NVML_CLOCK_SM, self.NVML_CLOCK_MEM = 1, 2
        self.NVML_PCIE_UTIL_TX_BYTES, self.NVML_PCIE_UTIL_RX_BYTES = 0, 1
        self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, self.NVML_VOLATILE_ECC = 1, 0
        self.NVML_DEVICE_MIG_DISABLE, self.NVML_DEVICE_MIG_ENABLE = 0, 1
        self.NVML_GPM_METRIC_SM_UTIL, self.NVML_GPM_METRIC_ANY_TENSOR_UTIL = 2, 5
        self.NVML_GPM_METRICS_GET_VERSION = 1

    def count(self, fn_name: str) -> int:
        """How many times a function was called."""
        return Counter(name for name, _ in self.calls)[fn_name]

    # --- library ---------------------------------------------------------

    def _enter(self, fn_name: str, args: tuple[Any, ...], handle: Handle | None = None) -> FakeGpu | None:
        self.calls.append((fn_name, args))
        if fn_name in self.missing:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if fn_name not in ("nvmlInit", "nvmlShutdown") and not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        gpu = handle.gpu
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if fn_name in gpu.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlInit(self) -> None:
        self._enter("nvmlInit", ())
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown", ())
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion", ())
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount", ())
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._enter("nvmlDeviceGetHandleByIndex", (index,))
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return Handle(self.gpus[index])

    # --- per device ------------------------------------------------------

    def nvmlDeviceGetUUID(self, h: Handle) -> str:
        return self._gpu("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetName(self, h: Handle) -> bytes:
        return self._gpu("nvmlDeviceGetName", h).name.encode()  # older pynvml returns bytes

    def nvmlDeviceGetUtilizationRates(self, h: Handle) -> Any:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=gpu.util_pct, memory=gpu.mem_util_pct)

    def nvmlDeviceGetMemoryInfo(self, h: Handle) -> Any:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", h)
        return SimpleNamespace(used=gpu.mem_used_bytes, total=gpu.mem_total_bytes, free=0)

    def nvmlDeviceGetPowerUsage(self, h: Handle) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Handle) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", h).power_limit_mw

    def nvmlDeviceGetTemperature(self, h: Handle, sensor: int) -> int:
        return self._gpu("nvmlDeviceGetTemperature", h, sensor).temp_c

    def nvmlDeviceGetClockInfo(self, h: Handle, clock: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", h, clock)
        return gpu.sm_clock_mhz if clock == self.NVML_CLOCK_SM else gpu.mem_clock_mhz

    def nvmlDeviceGetPcieThroughput(self, h: Handle, counter: int) -> int:
        gpu = self._gpu("nvmlDeviceGetPcieThroughput", h, counter)
        return gpu.pcie_rx_kib_s if counter == self.NVML_PCIE_UTIL_RX_BYTES else gpu.pcie_tx_kib_s

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", h).clock_event_mask

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Handle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", h).clock_event_mask

    def nvmlDeviceGetTotalEccErrors(self, h: Handle, error_type: int, counter_type: int) -> int:
        return self._gpu("nvmlDeviceGetTotalEccErrors", h, error_type, counter_type).ecc_uncorrected

    def nvmlDeviceGetComputeRunningProcesses(self, h: Handle) -> list[Any]:
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_bytes) for p in gpu.processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: Handle) -> list[Any]:
        self._gpu("nvmlDeviceGetGraphicsRunningProcesses", h)
        return []

    def nvmlDeviceGetProcessUtilization(self, h: Handle, since_us: int) -> list[Any]:
        gpu = self._gpu("nvmlDeviceGetProcessUtilization", h, since_us)
        fresh = [s for s in gpu.util_samples if s[1] > since_us]
        if not fresh:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=p, timeStamp=ts, smUtil=sm, memUtil=mem) for p, ts, sm, mem in fresh]

    def nvmlDeviceGetMigMode(self, h: Handle) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMigMode", h)
        if gpu.mig is None and not gpu.mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = self.NVML_DEVICE_MIG_ENABLE if gpu.mig is not None else self.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Handle) -> int:
        self._gpu("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Handle, slot: int) -> Handle:
        gpu = self._gpu("nvmlDeviceGetMigDeviceHandleByIndex", h, slot)
        if gpu.mig is None or slot >= len(gpu.mig):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return Handle(gpu.mig[slot])

    # --- GPM ---------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, h: Handle) -> Any:
        gpu = self._gpu("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(version=1, isSupportedDevice=int(gpu.gpm is not None))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc", ())
        self.gpm_samples_live += 1
        return SimpleNamespace(gpu=None)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._enter("nvmlGpmSampleFree", (sample,))
        self.gpm_samples_live -= 1

    def nvmlGpmSampleGet(self, h: Handle, sample: Any) -> Any:
        sample.gpu = self._gpu("nvmlGpmSampleGet", h, sample)
        return sample

    def nvmlGpmMetricsGet(self, request: MetricsGet) -> MetricsGet:
        self._enter("nvmlGpmMetricsGet", (request,))
        gpu = request.sample2.gpu
        values = {self.NVML_GPM_METRIC_SM_UTIL: gpu.gpm[0], self.NVML_GPM_METRIC_ANY_TENSOR_UTIL: gpu.gpm[1]}
        for metric in request.metrics[: request.numMetrics]:
            metric.value = values[metric.metricId]
            metric.nvmlReturn = NVML_SUCCESS
        return request

    def _gpu(self, fn_name: str, h: Handle, *args: Any) -> FakeGpu:
        gpu = self._enter(fn_name, (h, *args), h)
        assert gpu is not None
        return gpu


def make_gpus(n: int, **overrides: Any) -> list[FakeGpu]:
    """``n`` healthy GPUs with distinct UUIDs (NVML spelling) and one process each."""
    return [
        FakeGpu(
            uuid=f"GPU-{i:08x}-1111-2222-3333-444444444444",
            processes=[FakeProcess(pid=1000 + i, used_bytes=(2 + i) << 30)],
            **overrides,
        )
        for i in range(n)
    ]
