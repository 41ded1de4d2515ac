"""GPU sampling over NVML: one ``GpuSample`` per call, and a thread that feeds the store.

Per GPU: utilization, memory, power, temperature, clocks, PCIe throughput,
clock-throttle reasons and ECC errors, read here; GPM SM/tensor activity on
Hopper and newer (``gpm``) and each process's memory and SM utilization
(``gpu_processes``), read by their own parts.  MIG instances get rows of
their own.  Whatever cannot be read is None with a reason in ``na``; with no
NVML at all the sample says why in ``unavailable``.  Nothing here raises.

Each read goes through the newest versioned call the driver has (memory as
nvidia-smi shows it, processes at the stride the driver writes) and none of
them blocks: PCIe and NVLink rates come from counters differenced between
samples (``nvml_counters``), never from the 20-ms ``nvmlDeviceGetPcieThroughput``.
Static facts (UUID, name, handles) are cached.  docs/gpu.md has the table of
what real drivers do that this follows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gputop.collect.gpu.gpm import GpmReader
from gputop.collect.gpu.nvml import DeviceReads, Nvml, text
from gputop.collect.gpu.nvml_counters import ThroughputCounters
from gputop.collect.gpu.processes import ProcessReader, pid_here, process_name
from gputop.collect.periodic import PeriodicThread
from gputop.collect.store import Store
from gputop.model.samples import GpuProcess, GpuReading, GpuSample

# Clock-event bits (nvml.h nvmlClocksEventReason*) -> the short names the UI shows.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "idle"),
    (0x002, "app clocks"),
    (0x004, "power cap"),
    (0x008, "hw slowdown"),
    (0x010, "sync boost"),
    (0x020, "sw thermal"),
    (0x040, "hw thermal"),
    (0x080, "power brake"),
    (0x100, "display clocks"),
)

# NVML enums, as fallbacks for a pynvml that lacks the names (values from nvml.h).
_CONSTANTS = {
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_CLOCK_SM": 1,
    "NVML_CLOCK_MEM": 2,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
    "NVML_VOLATILE_ECC": 0,
    "NVML_DEVICE_MIG_ENABLE": 1,
}

PER_PHYSICAL_GPU = "read on the parent GPU's row"
LISTED_PER_MIG = "listed per MIG instance"


def decode_throttle_reasons(mask: int) -> tuple[str, ...]:
    """The clock-event bitmask as short names; unknown bits as hex so nothing is hidden."""
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    known = 0
    for bit, _ in THROTTLE_REASONS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"0x{bit:x}")
            rest &= ~bit
        bit <<= 1
    return tuple(names)


@dataclass
class _Static:
    """What does not change while NVML stays initialised, cached per NVML index."""

    handle: Any
    uuid: str
    name: str


class GpuSampler:
    """Reads every GPU through one ``Nvml``; ``sample()`` is safe to call from any thread."""

    def __init__(
        self,
        nvml: Nvml | None = None,
        *,
        clock: Callable[[], float] = time.time,
        name_of_pid: Callable[[int], str | None] = process_name,
        pid_here: Callable[[int], tuple[bool, int | None]] = pid_here,
    ) -> None:
        self.nvml = nvml if nvml is not None else Nvml()
        self._clock = clock
        self._processes = ProcessReader(self.nvml, name_of_pid=name_of_pid, pid_here=pid_here)
        self._gpm = GpmReader(self.nvml)
        self._counters = ThroughputCounters()
        self._lock = threading.Lock()
        self._static: dict[int, _Static] = {}
        self._known: dict[int, tuple[str, str]] = {}  # index -> (uuid, name), kept after a GPU is lost
        self._generation = -1

    def sample(self) -> GpuSample:
        """Every GPU now, or ``GpuSample(unavailable=...)``; never raises."""
        with self._lock:
            t = self._clock()
            try:
                return self._sample(t)
            except Exception as exc:  # a bug here must not take the dashboard down
                return GpuSample(t=t, unavailable=f"GPU sampler error: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        """Free GPM buffers and shut NVML down."""
        with self._lock:
            self._gpm.close()
            self.nvml.shutdown()

    def _sample(self, t: float) -> GpuSample:
        why = self.nvml.start()
        if why is not None:
            return GpuSample(t=t, unavailable=why)
        if self.nvml.generation != self._generation:
            # A new NVML session: old handles and GPM buffers belong to the last one.
            self._static.clear()
            self._gpm.drop_buffers()
            self._counters = ThroughputCounters()
            self._generation = self.nvml.generation
        driver, _ = self.nvml.call("nvmlSystemGetDriverVersion")
        driver_version = text(driver) if driver is not None else None
        count, why = self.nvml.call("nvmlDeviceGetCount")
        if count is None:
            return GpuSample(t=t, unavailable=f"cannot count GPUs: {why}", driver_version=driver_version)
        if count == 0:
            return GpuSample(t=t, unavailable="NVML sees no GPU", driver_version=driver_version)
        gpus: list[GpuReading] = []
        for index in range(count):
            gpus.extend(self._read_gpu(index))
        return GpuSample(t=t, gpus=tuple(gpus), driver_version=driver_version)

    def _static_of(self, index: int) -> _Static | str:
        static = self._static.get(index)
        if static is not None:
            return static
        handle, why = self.nvml.call("nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            return why or "no handle"
        uuid, why = self.nvml.call("nvmlDeviceGetUUID", handle)
        if uuid is None:
            return why or "no UUID"
        name, _ = self.nvml.call("nvmlDeviceGetName", handle)
        static = _Static(handle=handle, uuid=text(uuid), name=text(name) if name is not None else "")
        self._static[index] = static
        self._known[index] = (static.uuid, static.name)
        return static

    def _read_gpu(self, index: int) -> list[GpuReading]:
        static = self._static_of(index)
        if isinstance(static, str):
            # A GPU seen before keeps its UUID, so the UI and the join can say which rank lost it.
            uuid, name = self._known.get(index, ("", ""))
            return [GpuReading(index=index, uuid=uuid, name=name, na={"gpu": static})]
        reads = DeviceReads(self.nvml, static.uuid, static.handle)
        mig_mode = reads.get("mig_mode", "nvmlDeviceGetMigMode", record=False)
        mig_on = bool(mig_mode) and mig_mode[0] == self._c("NVML_DEVICE_MIG_ENABLE")
        fields = self._read_device_fields(reads)
        fields.update(self._read_physical_fields(reads))
        if mig_on:
            processes: tuple[GpuProcess, ...] = ()
            reads.na["processes"] = LISTED_PER_MIG
        else:
            processes = self._processes.read(reads)
            fields.update(self._gpm.read(reads))
        if reads.lost:
            # Forget handles and answers: after a reset the GPU may come back different.
            self._static.pop(index, None)
            self.nvml.forget_device(static.uuid)
            self._counters.forget(static.uuid)
            self._gpm.forget(static.uuid)
        rows = [GpuReading(index=index, uuid=static.uuid, name=static.name, processes=processes, na=reads.na, **fields)]
        if mig_on and not reads.lost:
            rows.extend(self._read_mig_instances(index, static))
        return rows

    def _read_device_fields(self, reads: DeviceReads) -> dict[str, Any]:
        """What a full GPU and a MIG instance both answer (or both refuse)."""
        out: dict[str, Any] = {}
        util = reads.get("util_pct", "nvmlDeviceGetUtilizationRates")
        if util is not None:
            out["util_pct"] = float(util.gpu)
            out["mem_util_pct"] = float(util.memory)
        elif "util_pct" in reads.na:
            reads.na["mem_util_pct"] = reads.na["util_pct"]
        out.update(self._read_memory(reads))
        return out

    def _read_memory(self, reads: DeviceReads) -> dict[str, Any]:
        """Used memory as nvidia-smi shows it: ``_v2``, which leaves the driver's reserved memory out.

        Since R510 the v1 call counts that reservation as used (an idle A100:
        912 MB used by v1, 7.8 MB by v2, rust-nvml #57); v1 is the fallback
        for a driver or bindings without v2, and then reserved is N/A.
        """
        lib = self.nvml.lib
        version = getattr(lib, "nvmlMemory_v2", None)
        memory = None
        if version is not None and not self.nvml.is_missing("nvmlDeviceGetMemoryInfo_v2"):
            memory = reads.get_with(
                "mem_used_bytes", "nvmlDeviceGetMemoryInfo_v2", lambda h: lib.nvmlDeviceGetMemoryInfo(h, version)
            )
            if memory is None and self.nvml.is_missing("nvmlDeviceGetMemoryInfo_v2") and not reads.lost:
                reads.na.pop("mem_used_bytes", None)
        out: dict[str, Any] = {}
        if memory is not None:
            out["mem_reserved_bytes"] = int(memory.reserved)
        elif "mem_used_bytes" not in reads.na:
            memory = reads.get("mem_used_bytes", "nvmlDeviceGetMemoryInfo")
            if memory is not None:
                reads.na["mem_reserved_bytes"] = "counted as used by this driver's memory call (v1)"
        if memory is None:
            reads.na["mem_total_bytes"] = reads.na["mem_reserved_bytes"] = reads.na.get("mem_used_bytes", "")
            return out
        out["mem_used_bytes"] = int(memory.used)
        out["mem_total_bytes"] = int(memory.total)
        return out

    def _read_physical_fields(self, reads: DeviceReads) -> dict[str, Any]:
        """What only the physical GPU has: power, heat, clocks, PCIe, ECC."""
        out: dict[str, Any] = {}
        power_mw = reads.get("power_w", "nvmlDeviceGetPowerUsage")
        if power_mw is not None:
            out["power_w"] = power_mw / 1000.0
        limit_mw = reads.get("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit")
        if limit_mw is not None:
            out["power_limit_w"] = limit_mw / 1000.0
        # nvmlDeviceGetTemperature is deprecated and goes in CUDA 14; TemperatureV is its replacement.
        temp = reads.first(
            "temp_c", ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"), self._c("NVML_TEMPERATURE_GPU")
        )
        if temp is not None:
            out["temp_c"] = float(temp)
        sm_clock = reads.get("sm_clock_mhz", "nvmlDeviceGetClockInfo", self._c("NVML_CLOCK_SM"))
        if sm_clock is not None:
            out["sm_clock_mhz"] = int(sm_clock)
        mem_clock = reads.get("mem_clock_mhz", "nvmlDeviceGetClockInfo", self._c("NVML_CLOCK_MEM"))
        if mem_clock is not None:
            out["mem_clock_mhz"] = int(mem_clock)
        out.update(self._read_throughput(reads))
        mask = reads.first(
            "throttle_reasons",
            ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
        )
        if mask is not None:
            out["throttle_reasons"] = decode_throttle_reasons(int(mask))
        # Uncorrected errors since the driver loaded: the ones that kill a job (corrected ones are routine).
        ecc = reads.get(
            "ecc_errors",
            "nvmlDeviceGetTotalEccErrors",
            self._c("NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
            self._c("NVML_VOLATILE_ECC"),
        )
        if ecc is not None:
            out["ecc_errors"] = int(ecc)
        return out

    def _read_throughput(self, reads: DeviceReads) -> dict[str, Any]:
        """PCIe and NVLink rates from the driver's byte counters, in one non-blocking call."""
        if reads.lost:
            return {}
        lib = self.nvml.lib

        def field_values(ids: list[tuple[int, int]]) -> Any:
            return reads.get_with(
                "pcie_rx_bytes_s", "nvmlDeviceGetFieldValues", lambda h: lib.nvmlDeviceGetFieldValues(h, ids)
            )

        rates, na = self._counters.read(reads.device, field_values, self.nvml.reason_of_code)
        failed = reads.na.pop("pcie_rx_bytes_s", None)
        for name in ("pcie_rx_bytes_s", "pcie_tx_bytes_s", "nvlink_rx_bytes_s", "nvlink_tx_bytes_s"):
            if name not in rates:
                reads.na[name] = failed or na.get(name, "not read")
        return dict(rates)

    def _read_mig_instances(self, index: int, parent: _Static) -> list[GpuReading]:
        count, _ = self.nvml.call("nvmlDeviceGetMaxMigDeviceCount", parent.handle)
        rows: list[GpuReading] = []
        for slot in range(count or 0):
            handle, _ = self.nvml.call("nvmlDeviceGetMigDeviceHandleByIndex", parent.handle, slot)
            if handle is None:
                continue  # an empty slot answers NOT_FOUND
            uuid, _ = self.nvml.call("nvmlDeviceGetUUID", handle)
            if uuid is None:
                continue
            name, _ = self.nvml.call("nvmlDeviceGetName", handle)
            reads = DeviceReads(self.nvml, text(uuid), handle)
            fields = self._read_device_fields(reads)
            processes = self._processes.read(reads)
            for shared in ("power_w", "temp_c", "sm_clock_mhz", "mem_clock_mhz"):
                reads.na[shared] = PER_PHYSICAL_GPU
            rows.append(
                GpuReading(
                    index=index,
                    uuid=text(uuid),
                    name=text(name) if name is not None else parent.name,
                    mig_parent_uuid=parent.uuid,
                    processes=processes,
                    na=reads.na,
                    **fields,
                )
            )
        return rows

    def _c(self, name: str) -> int:
        return self.nvml.constant(name, _CONSTANTS[name])


class GpuSamplerThread:
    """Samples the GPUs every ``interval_s`` on a daemon thread and adds each sample to the store."""

    def __init__(self, store: Store, interval_s: float = 1.0, *, sampler: GpuSampler | None = None) -> None:
        self.sampler = sampler if sampler is not None else GpuSampler()
        self._store = store
        self._thread = PeriodicThread("gputop-gpu-sampler", interval_s, self._tick, on_stop=self.sampler.close)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._thread.stop(timeout_s)

    def _tick(self) -> None:
        self._store.add_gpu(self.sampler.sample())
