"""The NVML stand-in (tests/support/nvml_standin) through the real nvidia-ml-py bindings.

No gputop code here: these tests pin what the stand-in answers to pynvml, in
this process (use_in_process) and in a subprocess (env_for), for each driver
generation in DRIVERS.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import tests.support.nvml_standin as standin
from tests.support.nvml_standin import DRIVERS, Gpu, MigInstance, Process, Scenario, for_driver, h100_node

MiB = 1 << 20
UINT_MAX = 0xFFFFFFFF


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "scenario.txt"


def start(monkeypatch, path: Path, scenario: Scenario, driver: str = "current"):
    """Write `scenario`, point pynvml at the `driver` build, nvmlInit; nvmlShutdown after."""
    scenario.write(path)
    nv = standin.use_in_process(monkeypatch, path, driver)
    nv.nvmlInit()
    return nv


@pytest.fixture
def shutdown():
    """Shut NVML down after the test if it is still initialised."""
    yield
    import pynvml

    try:
        while True:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        pass


# ---- init, system, identity ---------------------------------------------------------------


def test_init_count_and_shutdown(monkeypatch, path):
    nv = start(monkeypatch, path, h100_node(16))
    assert nv.nvmlDeviceGetCount() == 16
    assert nv.nvmlSystemGetDriverVersion() == "550.54.15"
    assert nv.nvmlSystemGetCudaDriverVersion() == 12040
    assert nv.nvmlSystemGetCudaDriverVersion_v2() == 12040
    assert nv.nvmlSystemGetNVMLVersion() == "12.550.54.15"
    nv.nvmlInit()  # a second init needs a second shutdown, as real NVML counts
    nv.nvmlShutdown()
    assert nv.nvmlDeviceGetCount() == 16
    nv.nvmlShutdown()
    with pytest.raises(nv.NVMLError_Uninitialized):
        nv.nvmlDeviceGetCount()
    with pytest.raises(nv.NVMLError_Uninitialized):
        nv.nvmlShutdown()


def test_missing_scenario_variable_is_driver_not_loaded(monkeypatch, path):
    Scenario([]).write(path)
    nv = standin.use_in_process(monkeypatch, path)
    monkeypatch.delenv(standin.ENV_VAR)
    with pytest.raises(nv.NVMLError_DriverNotLoaded) as caught:
        nv.nvmlInit()
    assert str(caught.value) == "Driver Not Loaded"


def test_init_error_from_the_scenario(monkeypatch, path):
    Scenario([], init_error=999).write(path)
    nv = standin.use_in_process(monkeypatch, path)
    with pytest.raises(nv.NVMLError_Unknown):
        nv.nvmlInit()
    assert nv.nvmlErrorString(3) == "Not Supported"
    assert nv.nvmlErrorString(15) == "GPU is lost"
    assert nv.nvmlErrorString(12345) == "Unknown Error"


def test_names_uuids_and_indices(monkeypatch, path, shutdown):
    scenario = h100_node(2)
    scenario.gpus[1].name = "NVIDIA A100-SXM4-80GB"
    nv = start(monkeypatch, path, scenario)
    h0, h1 = nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(1)
    assert nv.nvmlDeviceGetName(h0) == "NVIDIA H100 80GB HBM3"
    assert nv.nvmlDeviceGetName(h1) == "NVIDIA A100-SXM4-80GB"
    assert nv.nvmlDeviceGetUUID(h0) == scenario.gpus[0].uuid
    assert nv.nvmlDeviceGetUUID(h1) == scenario.gpus[1].uuid != scenario.gpus[0].uuid
    assert nv.nvmlDeviceGetIndex(h1) == 1
    assert nv.nvmlDeviceGetPciInfo(h0).busId == "00000000:18:00.0"
    assert nv.nvmlDeviceGetCudaComputeCapability(h0) == (9, 0)
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetName(nv.c_nvmlDevice_t())  # NULL handle


def test_readings(monkeypatch, path, shutdown):
    gpu = Gpu(uuid="GPU-1", util_pct=87, mem_util_pct=31, power_mw=512_000, temp_c=61,
              sm_clock_mhz=1755, mem_clock_mhz=2619, clock_events=0x4, ecc=2)  # fmt: skip
    nv = start(monkeypatch, path, Scenario([gpu]))
    h = nv.nvmlDeviceGetHandleByIndex(0)
    util = nv.nvmlDeviceGetUtilizationRates(h)
    assert (util.gpu, util.memory) == (87, 31)
    assert nv.nvmlDeviceGetPowerUsage(h) == 512_000
    assert nv.nvmlDeviceGetEnforcedPowerLimit(h) == 700_000
    assert nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU) == 61
    assert nv.nvmlDeviceGetTemperatureV(h, nv.NVML_TEMPERATURE_GPU) == 61
    assert nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM) == 1755
    assert nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM) == 2619
    assert nv.nvmlDeviceGetCurrentClocksEventReasons(h) == 0x4
    assert nv.nvmlDeviceGetCurrentClocksThrottleReasons(h) == 0x4
    assert nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC) == 2
    assert nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES) == 1000
    assert nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES) == 500


def test_memory_v1_counts_reserved_as_used_v2_apart(monkeypatch, path, shutdown):
    gpu = Gpu(uuid="GPU-1", total_bytes=81559 * MiB, reserved_bytes=490 * MiB, used_bytes=600 * MiB)
    nv = start(monkeypatch, path, Scenario([gpu]))
    h = nv.nvmlDeviceGetHandleByIndex(0)
    v1 = nv.nvmlDeviceGetMemoryInfo(h)
    v2 = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    assert v1.total == v2.total == 81559 * MiB
    assert v1.used == 1090 * MiB
    assert (v2.used, v2.reserved) == (600 * MiB, 490 * MiB)
    assert v1.free == v2.free == (81559 - 1090) * MiB
    with pytest.raises(nv.NVMLError_ArgumentVersionMismatch):
        nv.nvmlDeviceGetMemoryInfo(h, version=0x01000028)


# ---- processes across driver generations --------------------------------------------------

TWO = [Process(4123, 600 * MiB), Process(4124, None)]


def test_processes_on_a_current_driver(monkeypatch, path, shutdown):
    gpu = Gpu(uuid="GPU-1", processes=TWO, graphics_processes=[Process(777, MiB)])
    nv = start(monkeypatch, path, Scenario([gpu, Gpu(uuid="GPU-2")]))
    h = nv.nvmlDeviceGetHandleByIndex(0)
    procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [(4123, 600 * MiB), (4124, None)]
    assert {(p.gpuInstanceId, p.computeInstanceId) for p in procs} == {(UINT_MAX, UINT_MAX)}
    assert [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses_v2(h)] == [4123, 4124]
    assert [p.pid for p in nv.nvmlDeviceGetGraphicsRunningProcesses(h)] == [777]
    assert nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(1)) == []

    # The unversioned C symbol writes v1 entries: pid, usedGpuMemory (16 bytes).
    class V1(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]

    fn = nv.nvmlLib.nvmlDeviceGetComputeRunningProcesses
    count = ctypes.c_uint(0)
    assert fn(h, ctypes.byref(count), None) == nv.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 2
    count.value = 1
    assert fn(h, ctypes.byref(count), (V1 * 1)()) == nv.NVML_ERROR_INSUFFICIENT_SIZE
    entries = (V1 * 2)()
    count.value = 2
    assert fn(h, ctypes.byref(count), entries) == nv.NVML_SUCCESS
    assert [(e.pid, e.usedGpuMemory) for e in entries] == [(4123, 600 * MiB), (4124, 2**64 - 1)]


def test_processes_on_a_driver_without_v3(monkeypatch, path, shutdown):
    gpu = Gpu(uuid="GPU-1", processes=TWO)
    nv = start(monkeypatch, path, for_driver(Scenario([gpu]), "no_v3"), driver="no_v3")
    h = nv.nvmlDeviceGetHandleByIndex(0)
    # pynvml's unversioned wrapper calls _v3 and turns FunctionNotFound into this:
    with pytest.raises(nv.NVMLLibraryMismatchError):
        nv.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in nv.nvmlDeviceGetComputeRunningProcesses_v2(h)] == [
        (4123, 600 * MiB),
        (4124, None),
    ]
    with pytest.raises(nv.NVMLError_FunctionNotFound):
        nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    with pytest.raises(nv.NVMLError_FunctionNotFound):
        nv.nvmlDeviceGetTemperatureV(h, nv.NVML_TEMPERATURE_GPU)
    with pytest.raises(nv.NVMLError_FunctionNotFound):
        nv.nvmlDeviceGetCurrentClocksEventReasons(h)
    with pytest.raises(nv.NVMLError_FunctionNotFound):
        nv.nvmlGpmQueryDeviceSupport(h)
    assert nv.nvmlSystemGetDriverVersion() == DRIVERS["no_v3"].version
    rx, tx = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES])
    assert rx.nvmlReturn == tx.nvmlReturn == nv.NVML_ERROR_NOT_SUPPORTED
    assert nv.nvmlDeviceGetMemoryInfo(h).total == gpu.total_bytes


def test_early_r535_v3_entries_are_misread_by_pynvml(monkeypatch, path, shutdown):
    """Early R535 drivers wrote 32-byte _v3 entries; pynvml strides 24 (nvitop #88, PR #79)."""
    gpu = Gpu(uuid="GPU-1", processes=[Process(4123, 600 * MiB), Process(4124, 700 * MiB)])
    nv = start(monkeypatch, path, Scenario([gpu]), driver="r535_early")
    h = nv.nvmlDeviceGetHandleByIndex(0)
    first, second = nv.nvmlDeviceGetComputeRunningProcesses(h)
    assert (first.pid, first.usedGpuMemory) == (4123, 600 * MiB)
    # The upstream bug, reproduced: the second entry is read 8 bytes early, so its "pid" is the
    # first entry's usedGpuCcProtectedMemory (0) and its "usedGpuMemory" the real pid.
    assert (second.pid, second.usedGpuMemory) == (0, 4124)

    class V3(ctypes.Structure):  # the layout the driver wrote
        _fields_ = [
            ("pid", ctypes.c_uint),
            ("usedGpuMemory", ctypes.c_ulonglong),
            ("gpuInstanceId", ctypes.c_uint),
            ("computeInstanceId", ctypes.c_uint),
            ("usedGpuCcProtectedMemory", ctypes.c_ulonglong),
        ]

    assert ctypes.sizeof(V3) == 32
    count = ctypes.c_uint(2)
    entries = (V3 * 2)()
    assert nv.nvmlLib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(count), entries) == 0
    assert [(e.pid, e.usedGpuMemory, e.gpuInstanceId) for e in entries] == [
        (4123, 600 * MiB, UINT_MAX),
        (4124, 700 * MiB, UINT_MAX),
    ]
    # _v2 still writes 24-byte entries, which pynvml reads correctly.
    assert [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses_v2(h)] == [4123, 4124]


def test_process_utilization_samples(monkeypatch, path, shutdown):
    gpu = Gpu(uuid="GPU-1", util_samples=[(4123, 1_000, 87, 30), (4124, 2_000, 10, 5)])
    nv = start(monkeypatch, path, Scenario([gpu]))
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert [(s.pid, s.smUtil, s.memUtil) for s in nv.nvmlDeviceGetProcessUtilization(h, 0)] == [
        (4123, 87, 30),
        (4124, 10, 5),
    ]
    [newer] = nv.nvmlDeviceGetProcessUtilization(h, 1_500)
    assert (newer.pid, newer.timeStamp) == (4124, 2_000)
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetProcessUtilization(h, 2_000)


# ---- field values ---------------------------------------------------------------------------


def test_field_values_pcie_counters_and_nvlink(monkeypatch, path, shutdown):
    scenario = Scenario(
        [
            Gpu(uuid="GPU-1", pcie_bytes=(123_456_789, 98_765_432), nvlink=(18, 18 * 1024, 36 * 1024)),
            Gpu(uuid="GPU-2", pcie_bytes=None),
        ]
    )
    nv = start(monkeypatch, path, scenario)
    h = nv.nvmlDeviceGetHandleByIndex(0)
    before = time.time() * 1e6
    values = nv.nvmlDeviceGetFieldValues(
        h,
        [
            nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
            nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
            nv.NVML_FI_DEV_NVLINK_LINK_COUNT,
            (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, UINT_MAX),
            (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, UINT_MAX),
            (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 3),
            (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 18),
            nv.NVML_FI_DEV_PCIE_COUNT_BAD_TLP,
        ],
    )
    assert [v.nvmlReturn for v in values] == [0, 0, 0, 0, 0, 0, nv.NVML_ERROR_INVALID_ARGUMENT, 3]
    assert [v.value.ullVal for v in values[:6]] == [123_456_789, 98_765_432, 18, 18 * 1024, 36 * 1024, 1024]
    assert {v.valueType for v in values} == {nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG}
    assert all(before - 1e6 <= v.timestamp <= time.time() * 1e6 + 1e6 for v in values)
    assert {v.latencyUsec for v in values} == {0}

    # No counters, no NVLink: each field answers NOT_SUPPORTED, the call itself succeeds.
    other = nv.nvmlDeviceGetFieldValues(
        nv.nvmlDeviceGetHandleByIndex(1),
        [nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, nv.NVML_FI_DEV_NVLINK_LINK_COUNT, (139, UINT_MAX)],
    )
    assert [v.nvmlReturn for v in other] == [nv.NVML_ERROR_NOT_SUPPORTED] * 3


# ---- faults and scenario changes ------------------------------------------------------------


def test_lost_gpu(monkeypatch, path, shutdown):
    scenario = h100_node(2)
    nv = start(monkeypatch, path, scenario)
    h1 = nv.nvmlDeviceGetHandleByIndex(1)
    assert nv.nvmlDeviceGetPowerUsage(h1) == 88_000
    scenario.gpus[1].lost = True
    scenario.write(path)
    assert nv.nvmlDeviceGetCount() == 2  # re-reads the file
    with pytest.raises(nv.NVMLError_GpuIsLost):
        nv.nvmlDeviceGetPowerUsage(h1)
    with pytest.raises(nv.NVMLError_GpuIsLost):
        nv.nvmlDeviceGetHandleByIndex(1)
    assert nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA H100 80GB HBM3"
    # A GPU the rewritten scenario no longer lists: its old handle answers GPU_IS_LOST too.
    Scenario(scenario.gpus[:1]).write(path)
    assert nv.nvmlDeviceGetCount() == 1
    with pytest.raises(nv.NVMLError_GpuIsLost):
        nv.nvmlDeviceGetUUID(h1)


def test_rewrite_is_picked_up_on_the_next_count(monkeypatch, path, shutdown):
    scenario = h100_node(1)
    nv = start(monkeypatch, path, scenario)
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert nv.nvmlDeviceGetComputeRunningProcesses(h) == []
    for step in range(1, 4):  # several rewrites within one second, each noticed
        scenario.gpus[0].processes.append(Process(5000 + step))
        scenario.gpus[0].pcie_bytes = (step, 2 * step)
        scenario.write(path)
        # not before nvmlDeviceGetCount ...
        assert len(nv.nvmlDeviceGetComputeRunningProcesses(h)) == step - 1
        assert nv.nvmlDeviceGetCount() == 1
        # ... but right after it
        assert [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)][-1] == 5000 + step
        [rx] = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES])
        assert rx.value.ullVal == step
    scenario.gpus.append(Gpu(uuid="GPU-new"))
    scenario.write(path)
    assert nv.nvmlDeviceGetCount() == 2
    assert nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(1)) == "GPU-new"


def test_unsupported_and_no_permission(monkeypatch, path, shutdown):
    # A consumer-card-like GPU: refuses ECC, MIG, process utilisation, power.
    gpu = Gpu(
        uuid="GPU-1",
        name="NVIDIA GeForce RTX 4090",
        unsupported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMigMode"},
        no_permission={"nvmlDeviceGetTotalEccErrors"},
    )
    nv = start(monkeypatch, path, Scenario([gpu]))
    h = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nv.NVMLError_NotSupported) as caught:
        nv.nvmlDeviceGetPowerUsage(h)
    assert str(caught.value) == "Not Supported"
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetMemoryInfo(h)
    with pytest.raises(nv.NVMLError_NotSupported):  # a listed name covers its _v2
        nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetMigMode(h)
    with pytest.raises(nv.NVMLError_NoPermission):
        nv.nvmlDeviceGetTotalEccErrors(h, 1, 0)
    assert nv.nvmlDeviceGetEnforcedPowerLimit(h) == 700_000  # others still answer


def test_pcie_throughput_sleeps_without_holding_the_lock(monkeypatch, path, shutdown):
    scenario = Scenario([Gpu(uuid="GPU-1", pcie_delay_ms=20), Gpu(uuid="GPU-2", pcie_delay_ms=300)])
    nv = start(monkeypatch, path, scenario)
    h0, h1 = nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(1)
    t = time.perf_counter()
    assert nv.nvmlDeviceGetPcieThroughput(h0, nv.NVML_PCIE_UTIL_RX_BYTES) == 1000
    assert time.perf_counter() - t >= 0.015  # a lower bound only

    # While one thread sleeps 300 ms inside the call, another thread's call goes through.
    slow = threading.Thread(target=nv.nvmlDeviceGetPcieThroughput, args=(h1, nv.NVML_PCIE_UTIL_TX_BYTES))
    t = time.perf_counter()
    slow.start()
    time.sleep(0.02)
    assert nv.nvmlDeviceGetTemperature(h0, nv.NVML_TEMPERATURE_GPU) == 28
    assert time.perf_counter() - t < 0.15
    slow.join()


def test_call_counters(monkeypatch, path, shutdown):
    nv = start(monkeypatch, path, h100_node(2))
    for _ in range(3):
        nv.nvmlDeviceGetCount()
    nv.nvmlDeviceGetUtilizationRates(nv.nvmlDeviceGetHandleByIndex(0))
    assert standin.calls("nvmlDeviceGetCount_v2") == 3
    assert standin.calls("nvmlInitWithFlags") == 1
    assert standin.calls("nvmlDeviceGetUtilizationRates") == 1
    assert standin.calls("nvmlDeviceGetPcieThroughput") == 0
    assert standin.calls("nvmlDeviceGetCount") == 0  # pynvml calls the _v2 symbol only


# ---- MIG and GPM ----------------------------------------------------------------------------


def test_mig_devices(monkeypatch, path, shutdown):
    mig = [
        MigInstance(0, "MIG-11111111-2222-3333-4444-555555555555", used_bytes=3 * MiB,
                    processes=[Process(6001, 2 * MiB)]),
        MigInstance(2, "MIG-22222222-2222-3333-4444-555555555555", name="NVIDIA H100 80GB HBM3 MIG 2g.20gb",
                    total_bytes=19968 * MiB),
    ]  # fmt: skip
    nv = start(monkeypatch, path, Scenario([Gpu(uuid="GPU-1", mig=mig), Gpu(uuid="GPU-2")]))
    parent, plain = nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(1)
    assert nv.nvmlDeviceGetMigMode(parent) == [1, 1]
    assert nv.nvmlDeviceGetMigMode(plain) == [0, 0]
    assert nv.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    assert nv.nvmlDeviceGetMaxMigDeviceCount(plain) == 0
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    m0 = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    m2 = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, 2)
    # pynvml returns the c_uint itself here, not its value
    assert nv.nvmlDeviceIsMigDeviceHandle(m0).value == 1
    assert nv.nvmlDeviceIsMigDeviceHandle(parent).value == 0
    assert nv.nvmlDeviceGetUUID(m0) == mig[0].uuid
    assert nv.nvmlDeviceGetName(m2) == "NVIDIA H100 80GB HBM3 MIG 2g.20gb"
    mem = nv.nvmlDeviceGetMemoryInfo(m0, version=nv.nvmlMemory_v2)
    assert (mem.total, mem.used, mem.reserved) == (mig[0].total_bytes, 3 * MiB, 0)
    assert nv.nvmlDeviceGetMemoryInfo(m2).total == 19968 * MiB
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetUtilizationRates(m0)
    with pytest.raises(nv.NVMLError_NotSupported):  # nor on the MIG-enabled parent
        nv.nvmlDeviceGetUtilizationRates(parent)
    [p] = nv.nvmlDeviceGetComputeRunningProcesses(m0)
    assert (p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) == (6001, 2 * MiB, 0, 0)
    assert nv.nvmlDeviceGetComputeRunningProcesses(m2) == []
    assert [q.pid for q in nv.nvmlDeviceGetComputeRunningProcesses(parent)] == [6001]
    back = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m0)
    assert nv.nvmlDeviceGetIndex(back) == 0
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(parent)
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetMigDeviceHandleByIndex(plain, 0)


def test_gpm_metrics(monkeypatch, path, shutdown):
    nv = start(monkeypatch, path, Scenario([Gpu(uuid="GPU-1", gpm=(45.5, 12.25)), Gpu(uuid="GPU-2")]))
    h, other = nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(1)
    assert nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1
    assert nv.nvmlGpmQueryDeviceSupport(other).isSupportedDevice == 0

    s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    nv.nvmlGpmSampleGet(h, s1)
    nv.nvmlGpmSampleGet(h, s2)
    request = nv.c_nvmlGpmMetricsGet_t()
    request.version = nv.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 3
    request.sample1, request.sample2 = s1, s2
    for i, metric in enumerate([nv.NVML_GPM_METRIC_SM_UTIL, nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL, 1]):
        request.metrics[i].metricId = metric
    nv.nvmlGpmMetricsGet(request)
    got = [(request.metrics[i].nvmlReturn, request.metrics[i].value) for i in range(3)]
    assert got == [(0, 45.5), (0, 12.25), (nv.NVML_ERROR_NOT_SUPPORTED, 0.0)]

    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlGpmSampleGet(other, s1)
    request.version = 2
    with pytest.raises(nv.NVMLError_ArgumentVersionMismatch):
        nv.nvmlGpmMetricsGet(request)
    nv.nvmlGpmSampleFree(s1)
    nv.nvmlGpmSampleFree(s2)
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlGpmSampleFree(s1)


# ---- subprocesses and builds ----------------------------------------------------------------

PROBE = """
import json, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
out = {"count": pynvml.nvmlDeviceGetCount(), "uuid": pynvml.nvmlDeviceGetUUID(h),
       "library": pynvml.nvmlLib._name}
try:
    out["pids"] = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
except pynvml.NVMLLibraryMismatchError:
    out["pids"] = "mismatch"
print(json.dumps(out))
"""


@pytest.mark.parametrize("driver", ["current", "no_v3"])
def test_subprocess_via_env_for(path, driver):
    scenario = h100_node(3)
    scenario.gpus[0].processes = [Process(4123)]
    scenario.write(path)
    env = {**os.environ, **standin.env_for(path, driver)}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["count"] == 3
    assert out["uuid"] == scenario.gpus[0].uuid
    assert out["library"] == "libnvidia-ml.so.1"  # found through LD_LIBRARY_PATH, by soname
    assert out["pids"] == ([4123] if driver == "current" else "mismatch")


def test_builds_are_cached_and_variants_differ():
    current = standin.build_driver("current")
    assert standin.build() == current
    assert standin.build_driver("no_v3") != current
    assert standin.build_driver("r535_early") != current
    no_v3 = ctypes.CDLL(str(standin.build_driver("no_v3") / "libnvidia-ml.so.1"))
    assert not hasattr(no_v3, "nvmlDeviceGetComputeRunningProcesses_v3")
    assert hasattr(no_v3, "nvmlDeviceGetComputeRunningProcesses_v2")


def test_concurrent_builds_are_safe(monkeypatch, tmp_path):
    monkeypatch.setattr(standin, "CACHE", tmp_path)
    folders: list[Path] = []
    threads = [threading.Thread(target=lambda: folders.append(standin.build(omit={"nvmlShutdown"}))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(folders)) == 1
    [folder] = set(folders)
    assert [p.name for p in folder.iterdir()] == ["libnvidia-ml.so.1"]  # no temporaries left
    assert not hasattr(ctypes.CDLL(str(folder / "libnvidia-ml.so.1")), "nvmlShutdown")


def test_missing_compiler_is_explained(monkeypatch, tmp_path):
    monkeypatch.setattr(standin, "CACHE", tmp_path)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)  # the module the stand-in looks the compiler up with
    with pytest.raises(RuntimeError, match="needs a C compiler: apt-get install gcc"):
        standin.build()
