"""GpuSampler through the real nvidia-ml-py over the stand-in libnvidia-ml: what a user sees on each kind of machine.

Every test here loads the C stand-in (tests/support/nvml_standin) into the real
``pynvml``: the versioned calls, struct layouts and error classes are the
bindings' own.  The scenarios follow what real drivers do (docs/gpu.md,
"What real drivers do").
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gputop.collect.gpu.nvml import GPU_LOST, NOT_SUPPORTED, Nvml
from gputop.collect.gpu.sampler import GpuSampler, GpuSamplerThread, decode_throttle_reasons
from gputop.collect.store import Store
from gputop.model.samples import GpuSample
from tests.support.nvml_standin import (
    Gpu,
    MiB,
    MigInstance,
    Process,
    Scenario,
    calls,
    for_driver,
    h100_node,
    use_in_process,
)


class Machine:
    """A stand-in NVML for one test: write a scenario, get samplers that read it through real pynvml."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = tmp_path / "nvml-scenario"
        self.monkeypatch = monkeypatch
        self.driver = "current"

    def load(self, scenario: Scenario, driver: str = "current") -> Machine:
        self.driver = driver
        (for_driver(scenario, driver) if driver != "current" else scenario).write(self.path)
        use_in_process(self.monkeypatch, self.path, driver)
        return self

    def rewrite(self, scenario: Scenario) -> None:
        """Change what the driver answers, mid-run (the library notices on the next device count)."""
        (for_driver(scenario, self.driver) if self.driver != "current" else scenario).write(self.path)

    def sampler(self, names: dict[int, str] | None = None, here: set[int] | None = None) -> GpuSampler:
        clock = iter(float(t) for t in range(1000, 100000))
        visible = here if here is not None else set(names or ())
        return GpuSampler(
            Nvml(),
            clock=lambda: next(clock),
            name_of_pid=(names or {}).get,
            pid_here=lambda pid: (pid in visible, None),
        )

    def calls(self, name: str) -> int:
        return calls(name, self.driver)


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Machine:
    return Machine(tmp_path, monkeypatch)


class TestEightGpus:
    """A healthy 8-GPU H100 node: every field read, converted to the units the names promise."""

    def test_every_gpu_in_nvml_order_with_its_readings(self, machine: Machine) -> None:
        node = h100_node(8, clock_events=0x4 | 0x40, ecc=2, used_bytes=600 * MiB, temp_c=60, power_mw=300_000)
        node.gpus[3].processes = [Process(pid=1003, used_bytes=600 * MiB)]
        sample = machine.load(node).sampler({1003: "python"}).sample()

        assert sample.unavailable is None
        assert sample.driver_version == "550.54.15"
        assert [g.index for g in sample.gpus] == list(range(8))
        assert len({g.uuid for g in sample.gpus}) == 8
        gpu = sample.gpus[3]
        assert gpu.uuid == node.gpus[3].uuid
        assert gpu.name == "NVIDIA H100 80GB HBM3"
        assert (gpu.util_pct, gpu.mem_util_pct) == (50.0, 20.0)
        assert (gpu.power_w, gpu.power_limit_w) == (300.0, 700.0)  # NVML gives mW
        assert gpu.temp_c == 60.0
        assert (gpu.sm_clock_mhz, gpu.mem_clock_mhz) == (1980, 2619)
        assert gpu.throttle_reasons == ("power cap", "hw thermal")
        assert gpu.ecc_errors == 2
        assert gpu.mig_parent_uuid is None
        assert [(p.pid, p.used_bytes, p.name) for p in gpu.processes] == [(1003, 600 * MiB, "python")]
        assert gpu.na.get("sm_active_pct")  # not a GPM device: N/A with a reason, not 0

    def test_memory_is_what_nvidia_smi_shows_and_the_driver_reservation_apart(self, machine: Machine) -> None:
        """v1 counts the driver's reserved memory as used since R510; nvidia-smi shows v2's figure."""
        node = h100_node(1, used_bytes=600 * MiB, reserved_bytes=615 * MiB)
        gpu = machine.load(node).sampler().sample().gpus[0]
        assert gpu.mem_used_bytes == 600 * MiB  # not 1,215 MiB
        assert gpu.mem_reserved_bytes == 615 * MiB
        assert gpu.mem_total_bytes == node.gpus[0].total_bytes

    def test_static_facts_are_not_asked_again(self, machine: Machine) -> None:
        sampler = machine.load(h100_node(8)).sampler()
        for _ in range(3):
            sampler.sample()
        assert machine.calls("nvmlInitWithFlags") == 1
        assert machine.calls("nvmlDeviceGetUUID") == 8
        assert machine.calls("nvmlDeviceGetHandleByIndex_v2") == 8

    def test_process_utilization_asks_from_the_newest_timestamp_already_read(self, machine: Machine) -> None:
        node = h100_node(1)
        gpu = node.gpus[0]
        gpu.processes = [Process(pid=10), Process(pid=11)]
        gpu.util_samples = [(10, 5_000, 40, 10), (10, 6_000, 60, 30), (99, 6_500, 90, 90)]
        sampler = machine.load(node).sampler(here={10, 11})

        by_pid = {p.pid: p for p in sampler.sample().gpus[0].processes}
        assert by_pid[10].sm_util_pct == 50.0  # mean of the samples since last time
        assert by_pid[10].mem_util_pct == 20.0
        assert by_pid[11].sm_util_pct is None  # no samples: unknown, not 0
        assert 99 not in by_pid  # a sample from a process that has exited is dropped

        gpu.util_samples.append((11, 7_000, 25, 5))
        machine.rewrite(node)
        by_pid = {p.pid: p for p in sampler.sample().gpus[0].processes}
        assert by_pid[11].sm_util_pct == 25.0
        assert by_pid[10].sm_util_pct is None  # nothing new for pid 10 since the last sample


class TestDriverGenerations:
    """The versioned calls: the newest the driver has, the stride it writes, and the fallbacks."""

    def test_a_driver_without_the_v3_calls_still_lists_the_process(self, machine: Machine) -> None:
        """nvidia-ml-py's unversioned call raises NVMLLibraryMismatchError there; v2 answers."""
        node = h100_node(2, clock_events=0x8)
        node.gpus[0].processes = [Process(pid=4123, used_bytes=600 * MiB), Process(pid=4124, used_bytes=700 * MiB)]
        sampler = machine.load(node, driver="no_v3").sampler()
        for _ in range(2):
            gpu = sampler.sample().gpus[0]
            assert [(p.pid, p.used_bytes) for p in gpu.processes] == [(4123, 600 * MiB), (4124, 700 * MiB)]
            assert "processes" not in gpu.na
        assert sampler.nvml.is_missing("nvmlDeviceGetComputeRunningProcesses_v3")  # remembered, not asked again

    def test_a_driver_without_v2_memory_gives_v1_and_says_reserved_is_inside_used(self, machine: Machine) -> None:
        node = h100_node(1, used_bytes=600 * MiB, reserved_bytes=615 * MiB)
        gpu = machine.load(node, driver="no_v3").sampler().sample().gpus[0]
        assert gpu.mem_used_bytes == 1215 * MiB  # all this driver says
        assert gpu.mem_reserved_bytes is None and "v1" in gpu.na["mem_reserved_bytes"]

    def test_older_driver_names_for_temperature_and_clock_events(self, machine: Machine) -> None:
        sampler = machine.load(h100_node(2, clock_events=0x8, temp_c=61), driver="no_v3").sampler()
        for _ in range(2):
            sample = sampler.sample()
            assert [g.throttle_reasons for g in sample.gpus] == [("hw slowdown",)] * 2
            assert [g.temp_c for g in sample.gpus] == [61.0, 61.0]
            assert all("throttle_reasons" not in g.na and "temp_c" not in g.na for g in sample.gpus)

    def test_gpm_missing_from_the_driver_is_not_called_unsupported_hardware(self, machine: Machine) -> None:
        gpu = machine.load(h100_node(1, gpm=(50.0, 20.0)), driver="no_v3").sampler().sample().gpus[0]
        assert "not in this driver" in gpu.na["sm_active_pct"]
        assert "Hopper" not in gpu.na["sm_active_pct"]

    def test_early_r535_entries_are_read_at_the_stride_the_driver_wrote(self, machine: Machine) -> None:
        """The bindings stride 24 bytes where these drivers wrote 32: every entry after the first misread."""
        node = h100_node(1)
        node.gpus[0].processes = [Process(pid=p, used_bytes=(p - 4000) * MiB) for p in (4123, 4124, 4125)]
        gpu = machine.load(node, driver="r535_early").sampler().sample().gpus[0]
        assert [(p.pid, p.used_bytes) for p in gpu.processes] == [(p, (p - 4000) * MiB) for p in (4123, 4124, 4125)]


class TestCounters:
    """PCIe and NVLink rates from the driver's counters: no call that blocks."""

    def test_rates_are_counter_differences_over_the_drivers_time(self, machine: Machine) -> None:
        node = h100_node(1, pcie_bytes=(1_000_000_000, 2_000_000_000), nvlink=(18, 10_000_000, 20_000_000))
        sampler = machine.load(node).sampler()
        first = sampler.sample().gpus[0]
        assert first.nvlink_rx_bytes_s is None and "two samples" in first.na["nvlink_rx_bytes_s"]
        time.sleep(0.2)
        machine.rewrite(replace(node, gpus=[replace(node.gpus[0], pcie_bytes=(1_500_000_000, 2_000_000_000),
                                                    nvlink=(18, 12_000_000, 20_000_000))]))  # fmt: skip
        second = sampler.sample().gpus[0]
        assert second.pcie_tx_bytes_s == 0.0
        assert second.pcie_rx_bytes_s is not None and 0.5e9 / 1.0 < second.pcie_rx_bytes_s < 0.5e9 / 0.15
        # NVLink counts KiB, summed over all 18 links (scope UINT_MAX), not link 0's share
        assert second.nvlink_rx_bytes_s is not None
        assert 2_000_000 * 1024 / 1.0 < second.nvlink_rx_bytes_s < 2_000_000 * 1024 / 0.15
        assert machine.calls("nvmlDeviceGetPcieThroughput") == 0

    def test_eight_gpus_with_a_20ms_pcie_call_sample_without_it(self, machine: Machine) -> None:
        sampler = machine.load(h100_node(8, pcie_delay_ms=20)).sampler()
        sampler.sample()
        start = time.perf_counter()
        sampler.sample()
        took = time.perf_counter() - start
        assert machine.calls("nvmlDeviceGetPcieThroughput") == 0, f"a blocking PCIe read ({took * 1000:.0f} ms)"

    def test_a_gpu_without_nvlink_says_so_and_is_not_asked_again(self, machine: Machine) -> None:
        sampler = machine.load(h100_node(1, nvlink=None)).sampler()
        for _ in range(3):
            gpu = sampler.sample().gpus[0]
        assert gpu.nvlink_rx_bytes_s is None and gpu.na["nvlink_rx_bytes_s"] == "no NVLink on this GPU"
        assert gpu.pcie_rx_bytes_s is not None

    def test_a_driver_without_pcie_byte_counters_leaves_pcie_na(self, machine: Machine) -> None:
        sampler = machine.load(h100_node(1), driver="no_v3").sampler()
        for _ in range(2):
            gpu = sampler.sample().gpus[0]
        assert gpu.pcie_rx_bytes_s is None and gpu.na["pcie_rx_bytes_s"] == NOT_SUPPORTED
        assert machine.calls("nvmlDeviceGetPcieThroughput") == 0


class TestContainer:
    """NVML reports host PIDs; in a container the rank's own process is listed under one not in /proc."""

    def test_hidden_pids_are_marked_not_visible(self, machine: Machine) -> None:
        node = h100_node(1)
        node.gpus[0].processes = [Process(pid=4123457, used_bytes=600 * MiB)]
        gpu = machine.load(node).sampler(here=set()).sample().gpus[0]
        (proc,) = gpu.processes
        assert (proc.pid, proc.visible, proc.name) == (4123457, False, None)

    def test_utilization_samples_under_untranslated_pids_go_to_the_one_process(self, machine: Machine) -> None:
        """560.35+ translate listed PIDs but not the utilization samples' (HAMi-core #112)."""
        node = h100_node(1)
        node.gpus[0].processes = [Process(pid=42)]
        node.gpus[0].util_samples = [(4123457, 5_000, 80, 30), (4123457, 6_000, 90, 40)]
        gpu = machine.load(node).sampler(here={42}).sample().gpus[0]
        assert gpu.processes[0].sm_util_pct == 85.0

    def test_with_several_processes_untranslated_samples_are_na_with_the_reason(self, machine: Machine) -> None:
        node = h100_node(1)
        node.gpus[0].processes = [Process(pid=42), Process(pid=43)]
        node.gpus[0].util_samples = [(4123457, 5_000, 80, 30)]
        gpu = machine.load(node).sampler(here={42, 43}).sample().gpus[0]
        assert [p.sm_util_pct for p in gpu.processes] == [None, None]
        assert "another namespace" in gpu.na["process_sm_util_pct"]


class TestLostGpu:
    """A GPU falls off the bus mid-run (NVML_ERROR_GPU_IS_LOST)."""

    def test_lost_gpu_is_reported_and_the_others_keep_sampling(self, machine: Machine) -> None:
        node = h100_node(4)
        sampler = machine.load(node).sampler()
        assert sampler.sample().gpus[2].util_pct == 50.0

        node.gpus[2].lost = True
        machine.rewrite(node)
        during = sampler.sample()
        assert during.unavailable is None
        assert [g.util_pct for g in during.gpus] == [50.0, 50.0, None, 50.0]
        lost = during.gpus[2]
        assert lost.uuid == node.gpus[2].uuid  # still says which GPU, so the join can name its rank
        assert lost.na["util_pct"] == GPU_LOST
        assert lost.na["power_w"] == GPU_LOST

        after = sampler.sample()
        assert after.gpus[2].uuid == node.gpus[2].uuid
        assert after.gpus[2].na == {"gpu": GPU_LOST}
        assert after.gpus[3].util_pct == 50.0

    def test_lost_gpu_stops_being_queried_field_by_field(self, machine: Machine) -> None:
        node = h100_node(1)
        sampler = machine.load(node).sampler()
        sampler.sample()
        node.gpus[0].lost = True
        machine.rewrite(node)
        before = {name: machine.calls(name) for name in ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo")}
        sampler.sample()
        assert {name: machine.calls(name) for name in before} == before  # the first read said "lost"


class TestNotSupported:
    """Consumer GPUs and VMs refuse some fields; they show N/A and are not asked again."""

    def test_unsupported_fields_are_na_and_never_asked_again(self, machine: Machine) -> None:
        refused = {"nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetProcessUtilization"}
        node = h100_node(2, name="NVIDIA GeForce RTX 4090", unsupported=refused)
        sampler = machine.load(node).sampler()
        for _ in range(4):
            sample = sampler.sample()
        for gpu in sample.gpus:
            assert gpu.ecc_errors is None and gpu.power_w is None
            assert gpu.na["ecc_errors"] == NOT_SUPPORTED and gpu.na["power_w"] == NOT_SUPPORTED
            assert gpu.util_pct == 50.0  # the rest still read
        assert machine.calls("nvmlDeviceGetTotalEccErrors") == 2
        assert machine.calls("nvmlDeviceGetPowerUsage") == 2
        assert machine.calls("nvmlDeviceGetUtilizationRates") == 2 * 4


class TestMig:
    """An H100 in MIG mode: each instance is a row of its own, under its parent."""

    def scenario(self) -> Scenario:
        instances = [
            MigInstance(slot=0, uuid="MIG-aaaa", used_bytes=5 << 30, processes=[Process(pid=500)]),
            MigInstance(slot=2, uuid="MIG-bbbb", used_bytes=1 << 30, processes=[Process(pid=501)]),
        ]
        return Scenario(
            [Gpu(uuid="GPU-plain", power_mw=300_000), Gpu(uuid="GPU-parent", power_mw=300_000, mig=instances)]
        )

    def test_instances_are_rows_with_their_parent(self, machine: Machine) -> None:
        rows = machine.load(self.scenario()).sampler().sample().gpus
        assert [(r.index, r.uuid, r.mig_parent_uuid) for r in rows] == [
            (0, "GPU-plain", None),
            (1, "GPU-parent", None),
            (1, "MIG-aaaa", "GPU-parent"),
            (1, "MIG-bbbb", "GPU-parent"),
        ]
        parent, first = rows[1], rows[2]
        assert parent.processes == ()  # listed per instance, so no process shows twice
        assert parent.power_w == 300.0  # power, heat and clocks belong to the physical GPU
        assert first.name == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
        assert [p.pid for p in first.processes] == [500]
        assert first.mem_used_bytes == 5 << 30
        assert first.util_pct is None and first.na["util_pct"] == NOT_SUPPORTED
        assert first.power_w is None and first.na["power_w"]


class TestGpm:
    """Hopper's GPM metrics: SM and tensor activity between two samples."""

    def test_needs_two_samples_then_reports_activity(self, machine: Machine) -> None:
        scenario = Scenario(
            [Gpu(uuid="GPU-h100", gpm=(71.5, 42.0)), Gpu(uuid="GPU-a100", name="NVIDIA A100-SXM4-80GB")]
        )
        sampler = machine.load(scenario).sampler()
        first = sampler.sample().gpus
        assert first[0].sm_active_pct is None and first[0].na["sm_active_pct"] == "GPM needs two samples"
        second = sampler.sample().gpus
        assert (second[0].sm_active_pct, second[0].tensor_active_pct) == (71.5, 42.0)
        assert second[1].sm_active_pct is None and "GPM not supported" in second[1].na["sm_active_pct"]
        sampler.sample()
        sampler.close()
        assert machine.calls("nvmlGpmSampleAlloc") == machine.calls("nvmlGpmSampleFree")  # no buffer leaks


class TestNoGpu:
    """Laptops, CI runners, CPU nodes: one line saying why, never an exception."""

    def test_driver_not_loaded(self, machine: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
        machine.load(h100_node(1))
        monkeypatch.delenv("GPUTOP_NVML_STANDIN")  # the stand-in then answers as a machine without a driver
        sampler = machine.sampler()
        sample = sampler.sample()
        assert sample.gpus == ()
        assert sample.unavailable is not None and "driver not loaded" in sample.unavailable
        assert "\n" not in sample.unavailable
        sampler.sample()
        assert machine.calls("nvmlInitWithFlags") == 1  # a machine without a driver does not grow one

    def test_no_library(self) -> None:
        """The real bindings with no libnvidia-ml on the machine (this one has none)."""
        script = "from gputop.collect.gpu.sampler import GpuSampler; print(GpuSampler().sample().unavailable)"
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert out.stdout.strip() == "NVML unavailable: libnvidia-ml not found (no NVIDIA driver installed)"

    def test_no_pynvml(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
        sample = GpuSampler().sample()
        assert sample.unavailable is not None and "nvidia-ml-py" in sample.unavailable

    def test_zero_gpus(self, machine: Machine) -> None:
        sample = machine.load(Scenario([])).sampler().sample()
        assert sample.gpus == () and sample.unavailable == "NVML sees no GPU"


class TestVanishedProcess:
    """A process NVML lists exits before its name is looked up."""

    def test_row_kept_without_name(self, machine: Machine) -> None:
        child = subprocess.Popen([sys.executable, "-c", "pass"])
        child.wait()  # reaped: its pid names nothing now
        node = h100_node(1)
        node.gpus[0].processes = [Process(pid=child.pid, used_bytes=None)]
        machine.load(node)
        sample = GpuSampler(Nvml()).sample()  # the real psutil name lookup and /proc check
        (proc,) = sample.gpus[0].processes
        assert proc.pid == child.pid
        assert proc.name is None and proc.used_bytes is None and not proc.visible


class TestThread:
    def test_feeds_the_store_until_stopped(self, machine: Machine) -> None:
        store = Store()
        got = threading.Event()

        class Watching(Store):
            def add_gpu(self, sample: GpuSample) -> None:
                store.add_gpu(sample)
                got.set()

        machine.load(h100_node(2))
        thread = GpuSamplerThread(Watching(), interval_s=0.05, sampler=machine.sampler())
        thread.start()
        assert got.wait(10)
        thread.stop()
        assert not thread._thread.running
        snap = store.snapshot(0.0)
        assert snap.gpu is not None and len(snap.gpu.gpus) == 2


def test_decode_throttle_reasons_keeps_unknown_bits() -> None:
    assert decode_throttle_reasons(0) == ()
    assert decode_throttle_reasons(0x1 | 0x800) == ("idle", "0x800")
