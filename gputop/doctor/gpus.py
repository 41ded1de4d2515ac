"""NVML and the GPUs: the library and driver, the versioned calls this driver has, what each GPU reads."""

from __future__ import annotations

import importlib
import importlib.metadata
from pathlib import Path
from typing import Any

from gputop.collect.gpu.nvml import NO_DRIVER, NO_LIBRARY, NO_PERMISSION, NO_PYNVML, Nvml, text
from gputop.collect.gpu.sampler import GpuSampler
from gputop.doctor.checks import (
    DRIVER_CALLS,
    GPUS,
    NVML,
    Check,
    MiB,
)
from gputop.model.samples import GpuReading

PROCESS_CALLS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)

# What gputop does on a driver without each versioned call (the process calls are worked out apart).
FALLBACKS = {
    "nvmlDeviceGetMemoryInfo_v2": "memory read through v1, which counts the driver's reserved memory as used",
    "nvmlDeviceGetTemperatureV": "temperature read through nvmlDeviceGetTemperature",
    "nvmlDeviceGetCurrentClocksEventReasons": "throttle reasons read through nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlGpmQueryDeviceSupport": "no SM and tensor activity (GPM)",
    "nvmlDeviceGetFieldValues": "no PCIe or NVLink throughput",
}

VERSIONED_CALLS = (*PROCESS_CALLS[:2], *FALLBACKS)

# What to do when NVML cannot start, by the reason gputop.collect.gpu.nvml gives.
NVML_FIXES = {
    NO_LIBRARY: "install the NVIDIA driver, or in a container start it with the GPUs (docker run --gpus all)",
    NO_DRIVER: "load the NVIDIA driver (nvidia-smi should work), or reboot after installing it",
    NO_PERMISSION: "give this user access to /dev/nvidia* (the video group on some systems)",
    NO_PYNVML: "pip install nvidia-ml-py",
}


def check_nvml(nvml: Nvml) -> Check:
    bindings = _package_version("nvidia-ml-py")
    why = nvml.start()
    if why is not None:
        reason = why.removeprefix("NVML unavailable: ")
        fix = NVML_FIXES.get(reason, "check that nvidia-smi works here")
        return Check(NVML, "problem", why, fix=fix, facts={"error": reason, "nvidia_ml_py": bindings})
    nvml_version = _answer(nvml, "nvmlSystemGetNVMLVersion")
    driver = _answer(nvml, "nvmlSystemGetDriverVersion")
    cuda_code, _ = nvml.call("nvmlSystemGetCudaDriverVersion")
    cuda = cuda_version(cuda_code) if cuda_code is not None else None
    library = loaded_library_path("libnvidia-ml")
    summary = f"NVML {nvml_version or '?'}, driver {driver or '?'}, CUDA {cuda or '?'}, nvidia-ml-py {bindings}"
    facts = {"nvml": nvml_version, "driver": driver, "cuda": cuda, "nvidia_ml_py": bindings, "library": library}
    return Check(NVML, "ok", summary, details=(f"library {library}",) if library else (), facts=facts)


def _answer(nvml: Nvml, fn_name: str) -> str | None:
    value, _ = nvml.call(fn_name)
    return text(value) if value is not None else None


def cuda_version(code: int) -> str:
    """NVML's CUDA version number (12040) as people write it (12.4)."""
    return f"{code // 1000}.{code % 1000 // 10}"


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def loaded_library_path(stem: str) -> str | None:
    """Where this process loaded a shared library from, so a report shows which libnvidia-ml it was."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if Path(path).name.startswith(stem):
                    return path
    except OSError:
        pass
    return None


def check_driver_calls(nvml: Nvml) -> Check:
    """Which versioned calls the loaded libnvidia-ml exports, and how gputop does without the missing ones."""
    if nvml.start() is not None:
        return Check(DRIVER_CALLS, "note", "not checked: NVML unavailable")
    library = nvml.lib.nvmlLib  # the bindings' ctypes CDLL; hasattr looks the symbol up
    present = {name: hasattr(library, name) for name in (*VERSIONED_CALLS, PROCESS_CALLS[2])}
    missing = [name for name in VERSIONED_CALLS if not present[name]]
    process_call = next((name for name in PROCESS_CALLS if present[name]), None)
    facts = {"calls": {name: present[name] for name in VERSIONED_CALLS}, "process_call": process_call}
    if not missing:
        summary = f"all {len(VERSIONED_CALLS)} versioned calls gputop uses are there"
        return Check(DRIVER_CALLS, "ok", summary, facts=facts)
    width = max(len(name) for name in missing)
    details = tuple(f"{name:<{width}}  missing: {without(name, process_call)}" for name in missing)
    summary = f"{len(missing)} of {len(VERSIONED_CALLS)} versioned calls missing (an older driver)"
    if process_call is None:
        return Check(DRIVER_CALLS, "problem", summary, fix="update the NVIDIA driver", details=details, facts=facts)
    fix = "gputop falls back as listed (a newer driver has them all)"
    return Check(DRIVER_CALLS, "note", summary, fix=fix, details=details, facts=facts)


def without(name: str, process_call: str | None) -> str:
    """What gputop does on a driver that lacks ``name``."""
    if name in PROCESS_CALLS:
        if process_call is None:
            return "no process listing at all"
        if process_call == PROCESS_CALLS[0]:
            return f"not needed: {process_call} is used"
        return f"processes listed through {process_call}"
    return FALLBACKS[name]


def check_gpus(sampler: GpuSampler) -> Check:
    sample = sampler.sample()
    if sample.unavailable is not None:
        nvml_down = sample.unavailable.startswith("NVML unavailable")
        if nvml_down:
            return Check(GPUS, "note", "not read: NVML unavailable (see the nvml line)", facts={"visible": 0})
        return Check(
            GPUS,
            "problem",
            sample.unavailable,
            fix="in a container, start it with the GPUs (docker run --gpus all), else check nvidia-smi",
            facts={"visible": 0},
        )
    rows = [_gpu_row(reading) for reading in sample.gpus]
    unreadable = [reading for reading in sample.gpus if "gpu" in reading.na]
    physical = [reading for reading in sample.gpus if reading.mig_parent_uuid is None]
    visible = len(physical) - len(unreadable)
    facts = {"visible": visible, "gpus": [_gpu_facts(reading) for reading in sample.gpus]}
    summary = f"{len(physical)} GPU{'s' if len(physical) != 1 else ''}"
    if unreadable:
        lost = ", ".join(str(reading.index) for reading in unreadable)
        fix = "see nvidia-smi and `dmesg | grep -i xid` for why"
        return Check(GPUS, "problem", f"{summary}, cannot read GPU {lost}", fix=fix, details=tuple(rows), facts=facts)
    return Check(GPUS, "ok", summary, details=tuple(rows), facts=facts)


def _gpu_row(reading: GpuReading) -> str:
    where = f"{reading.index}" if reading.mig_parent_uuid is None else f"{reading.index} MIG"
    if "gpu" in reading.na:
        return f"{where}  {reading.uuid or '?'}  unreadable: {reading.na['gpu']}"
    if reading.mem_total_bytes is not None and reading.mem_used_bytes is not None:
        memory = f"{reading.mem_used_bytes // MiB} MiB / {reading.mem_total_bytes // MiB} MiB used"
    else:
        memory = f"memory N/A: {reading.na.get('mem_used_bytes', 'not read')}"
    return f"{where}  {reading.name}  {reading.uuid}  {memory}"


def _gpu_facts(reading: GpuReading) -> dict[str, Any]:
    return {
        "index": reading.index,
        "name": reading.name,
        "uuid": reading.uuid,
        "mig_parent_uuid": reading.mig_parent_uuid,
        "mem_used_bytes": reading.mem_used_bytes,
        "mem_total_bytes": reading.mem_total_bytes,
        "na": dict(reading.na),
    }
