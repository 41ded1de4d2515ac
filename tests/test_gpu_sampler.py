"""GpuSampler over a fake NVML: what a user sees for each way a GPU machine can behave."""

from __future__ import annotations

import sys
import threading

import pytest

from gputop.collect.gpu import GpuSampler, GpuSamplerThread, decode_throttle_reasons
from gputop.collect.nvml import GPU_LOST, NOT_SUPPORTED, Nvml
from gputop.collect.store import Store
from gputop.model.samples import GpuSample
from tests.fake_nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    FakeGpu,
    FakeNvml,
    FakeProcess,
    make_gpus,
)


def sampler_for(backend: FakeNvml, names: dict[int, str] | None = None) -> GpuSampler:
    clock = iter(float(t) for t in range(1000, 100000))
    return GpuSampler(Nvml(backend), clock=lambda: next(clock), name_of_pid=(names or {}).get)


class TestEightGpus:
    """A healthy 8-GPU node: every field read, converted to the units the names promise."""

    def test_every_gpu_in_nvml_order_with_its_readings(self) -> None:
        backend = FakeNvml(make_gpus(8, clock_event_mask=0x4 | 0x40, ecc_uncorrected=2))
        sample = sampler_for(backend, {1003: "python"}).sample()

        assert sample.unavailable is None
        assert sample.driver_version == "550.54.15"
        assert [g.index for g in sample.gpus] == list(range(8))
        assert len({g.uuid for g in sample.gpus}) == 8
        gpu = sample.gpus[3]
        assert gpu.uuid == "GPU-00000003-1111-2222-3333-444444444444"
        assert gpu.name == "NVIDIA H100 80GB HBM3"  # bytes from an older pynvml decoded
        assert (gpu.util_pct, gpu.mem_util_pct) == (50.0, 20.0)
        assert (gpu.mem_used_bytes, gpu.mem_total_bytes) == (10 << 30, 80 << 30)
        assert (gpu.power_w, gpu.power_limit_w) == (300.0, 700.0)  # NVML gives mW
        assert gpu.temp_c == 60.0
        assert (gpu.sm_clock_mhz, gpu.mem_clock_mhz) == (1980, 2619)
        assert (gpu.pcie_rx_bytes_s, gpu.pcie_tx_bytes_s) == (1000 * 1024.0, 500 * 1024.0)  # NVML gives KiB/s
        assert gpu.throttle_reasons == ("power cap", "hw thermal")
        assert gpu.ecc_errors == 2
        assert gpu.mig_parent_uuid is None
        assert [(p.pid, p.used_bytes, p.name) for p in gpu.processes] == [(1003, 5 << 30, "python")]
        assert gpu.na.get("sm_active_pct")  # not a GPM device: N/A with a reason, not 0

    def test_static_facts_are_not_asked_again(self) -> None:
        backend = FakeNvml(make_gpus(8))
        sampler = sampler_for(backend)
        for _ in range(3):
            sampler.sample()
        assert backend.count("nvmlInit") == 1
        assert backend.count("nvmlDeviceGetUUID") == 8
        assert backend.count("nvmlDeviceGetHandleByIndex") == 8

    def test_process_utilization_asks_from_the_newest_timestamp_already_read(self) -> None:
        gpus = make_gpus(1)
        gpus[0].processes = [FakeProcess(pid=10), FakeProcess(pid=11)]
        gpus[0].util_samples = [(10, 5_000, 40, 10), (10, 6_000, 60, 30), (99, 6_500, 90, 90)]
        backend = FakeNvml(gpus)
        sampler = sampler_for(backend)

        first = sampler.sample().gpus[0]
        by_pid = {p.pid: p for p in first.processes}
        assert by_pid[10].sm_util_pct == 50.0  # mean of the samples since last time
        assert by_pid[10].mem_util_pct == 20.0
        assert by_pid[11].sm_util_pct is None  # no samples: unknown, not 0
        assert 99 not in by_pid  # a sample from a process that has exited is dropped

        gpus[0].util_samples.append((11, 7_000, 25, 5))
        second = sampler.sample().gpus[0]
        since = [args[1] for name, args in backend.calls if name == "nvmlDeviceGetProcessUtilization"]
        assert since == [0, 6_500]
        by_pid = {p.pid: p for p in second.processes}
        assert by_pid[11].sm_util_pct == 25.0
        assert by_pid[10].sm_util_pct is None  # nothing new for pid 10 since the last sample

    def test_older_driver_without_clock_event_reasons_falls_back_to_throttle_reasons(self) -> None:
        backend = FakeNvml(make_gpus(2, clock_event_mask=0x8), missing={"nvmlDeviceGetCurrentClocksEventReasons"})
        sampler = sampler_for(backend)
        for _ in range(2):
            sample = sampler.sample()
            assert [g.throttle_reasons for g in sample.gpus] == [("hw slowdown",)] * 2
            assert all("throttle_reasons" not in g.na for g in sample.gpus)
        assert backend.count("nvmlDeviceGetCurrentClocksEventReasons") == 1  # missing: remembered


class TestLostGpu:
    """A GPU falls off the bus mid-run (NVML_ERROR_GPU_IS_LOST)."""

    def test_lost_gpu_is_reported_and_the_others_keep_sampling(self) -> None:
        gpus = make_gpus(4)
        backend = FakeNvml(gpus)
        sampler = sampler_for(backend)
        assert sampler.sample().gpus[2].util_pct == 50.0

        gpus[2].lost = True
        during = sampler.sample()
        assert during.unavailable is None
        assert [g.util_pct for g in during.gpus] == [50.0, 50.0, None, 50.0]
        lost = during.gpus[2]
        assert lost.uuid == gpus[2].uuid  # still says which GPU, so the join can name its rank
        assert lost.na["util_pct"] == GPU_LOST
        assert lost.na["power_w"] == GPU_LOST

        after = sampler.sample()
        assert after.gpus[2].uuid == gpus[2].uuid
        assert after.gpus[2].na == {"gpu": GPU_LOST}
        assert after.gpus[3].util_pct == 50.0

    def test_lost_gpu_stops_being_queried_field_by_field(self) -> None:
        gpus = make_gpus(1)
        backend = FakeNvml(gpus)
        sampler = sampler_for(backend)
        sampler.sample()
        gpus[0].lost = True
        before = len(backend.calls)
        sampler.sample()
        device_calls = [name for name, args in backend.calls[before:] if args and hasattr(args[0], "gpu")]
        assert len(device_calls) == 1  # the first read said "lost"; the rest were not attempted


class TestNotSupported:
    """Consumer GPUs and VMs refuse some fields; they show N/A and are not asked again."""

    def test_unsupported_fields_are_na_and_never_asked_again(self) -> None:
        refused = {"nvmlDeviceGetPcieThroughput", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPowerUsage"}
        backend = FakeNvml(make_gpus(2, unsupported=refused))
        sampler = sampler_for(backend)
        for _ in range(4):
            sample = sampler.sample()
        for gpu in sample.gpus:
            assert gpu.pcie_rx_bytes_s is None and gpu.ecc_errors is None and gpu.power_w is None
            assert gpu.na["pcie_rx_bytes_s"] == NOT_SUPPORTED
            assert gpu.na["pcie_tx_bytes_s"] == NOT_SUPPORTED
            assert gpu.na["ecc_errors"] == NOT_SUPPORTED
            assert gpu.util_pct == 50.0  # the rest still read
        assert backend.count("nvmlDeviceGetPcieThroughput") == 2 * 2  # rx and tx, once per GPU
        assert backend.count("nvmlDeviceGetTotalEccErrors") == 2
        assert backend.count("nvmlDeviceGetPowerUsage") == 2
        assert backend.count("nvmlDeviceGetUtilizationRates") == 2 * 4


class TestMig:
    """An A100/H100 in MIG mode: each instance is a row of its own, under its parent."""

    def make(self) -> tuple[FakeNvml, list[FakeGpu]]:
        mig_refuses = {"nvmlDeviceGetUtilizationRates", "nvmlDeviceGetProcessUtilization"}
        instances = [
            FakeGpu(uuid="MIG-aaaa", name="NVIDIA A100 MIG 3g.40gb", mem_used_bytes=5 << 30,
                    processes=[FakeProcess(pid=500)], unsupported=mig_refuses),
            FakeGpu(uuid="MIG-bbbb", name="NVIDIA A100 MIG 3g.40gb", mem_used_bytes=1 << 30,
                    processes=[FakeProcess(pid=501)], unsupported=mig_refuses),
        ]  # fmt: skip
        gpus = [FakeGpu(uuid="GPU-plain", mig_capable=True), FakeGpu(uuid="GPU-parent", mig=instances)]
        return FakeNvml(gpus), gpus

    def test_instances_are_rows_with_their_parent(self) -> None:
        backend, _ = self.make()
        rows = sampler_for(backend).sample().gpus
        assert [(r.index, r.uuid, r.mig_parent_uuid) for r in rows] == [
            (0, "GPU-plain", None),
            (1, "GPU-parent", None),
            (1, "MIG-aaaa", "GPU-parent"),
            (1, "MIG-bbbb", "GPU-parent"),
        ]
        parent, first = rows[1], rows[2]
        assert parent.processes == ()  # listed per instance, so no process shows twice
        assert parent.power_w == 300.0  # power, heat and clocks belong to the physical GPU
        assert first.name == "NVIDIA A100 MIG 3g.40gb"
        assert [p.pid for p in first.processes] == [500]
        assert first.mem_used_bytes == 5 << 30
        assert first.util_pct is None and first.na["util_pct"] == NOT_SUPPORTED
        assert first.power_w is None and first.na["power_w"]

    def test_empty_mig_slots_are_skipped_quietly(self) -> None:
        backend, _ = self.make()
        sample = sampler_for(backend).sample()
        assert sample.unavailable is None
        assert len([r for r in sample.gpus if r.mig_parent_uuid]) == 2  # 7 slots, 2 used


class TestGpm:
    """Hopper's GPM metrics: SM and tensor activity between two samples."""

    def test_needs_two_samples_then_reports_activity(self) -> None:
        backend = FakeNvml([FakeGpu(uuid="GPU-h100", gpm=(71.5, 42.0)), FakeGpu(uuid="GPU-a100")])
        sampler = sampler_for(backend)
        first = sampler.sample().gpus
        assert first[0].sm_active_pct is None and first[0].na["sm_active_pct"] == "GPM needs two samples"
        second = sampler.sample().gpus
        assert (second[0].sm_active_pct, second[0].tensor_active_pct) == (71.5, 42.0)
        assert second[1].sm_active_pct is None and "GPM not supported" in second[1].na["sm_active_pct"]
        sampler.sample()
        assert backend.gpm_samples_live == 1  # only the buffer kept for the next delta
        sampler.close()
        assert backend.gpm_samples_live == 0


class TestNoGpu:
    """Laptops, CI runners, CPU nodes: one line saying why, never an exception."""

    @pytest.mark.parametrize(
        ("code", "words"),
        [(NVML_ERROR_LIBRARY_NOT_FOUND, "no NVIDIA driver"), (NVML_ERROR_DRIVER_NOT_LOADED, "driver not loaded")],
    )
    def test_no_driver(self, code: int, words: str) -> None:
        backend = FakeNvml(make_gpus(1), init_error=code)
        sampler = sampler_for(backend)
        sample = sampler.sample()
        assert sample.gpus == ()
        assert sample.unavailable is not None and words in sample.unavailable
        assert "\n" not in sample.unavailable
        sampler.sample()
        assert backend.count("nvmlInit") == 1  # a machine without a driver does not grow one

    def test_no_pynvml(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
        sample = GpuSampler().sample()
        assert sample.unavailable is not None and "nvidia-ml-py" in sample.unavailable

    def test_zero_gpus(self) -> None:
        sample = sampler_for(FakeNvml([])).sample()
        assert sample.gpus == () and sample.unavailable == "NVML sees no GPU"

    def test_this_machine(self) -> None:
        """Whatever this machine has, sampling returns a sample."""
        sampler = GpuSampler()
        sample = sampler.sample()
        sampler.close()
        assert isinstance(sample, GpuSample)
        assert sample.gpus or sample.unavailable


class TestVanishedProcess:
    """A process NVML lists exits before its name is looked up."""

    def test_row_kept_without_name(self) -> None:
        import subprocess

        child = subprocess.Popen([sys.executable, "-c", "pass"])
        child.wait()  # reaped: its pid names nothing now
        gpus = make_gpus(1)
        gpus[0].processes = [FakeProcess(pid=child.pid, used_bytes=None)]
        sample = GpuSampler(Nvml(FakeNvml(gpus))).sample()  # the real psutil name lookup
        (proc,) = sample.gpus[0].processes
        assert proc.pid == child.pid
        assert proc.name is None and proc.used_bytes is None


class TestThread:
    def test_feeds_the_store_until_stopped(self) -> None:
        store = Store()
        got = threading.Event()

        class Watching(Store):
            def add_gpu(self, sample: GpuSample) -> None:
                store.add_gpu(sample)
                got.set()

        thread = GpuSamplerThread(Watching(), interval_s=0.05, sampler=sampler_for(FakeNvml(make_gpus(2))))
        thread.start()
        assert got.wait(10)
        thread.stop()
        assert not thread._thread.running
        snap = store.snapshot(0.0)
        assert snap.gpu is not None and len(snap.gpu.gpus) == 2


def test_decode_throttle_reasons_keeps_unknown_bits() -> None:
    assert decode_throttle_reasons(0) == ()
    assert decode_throttle_reasons(0x1 | 0x800) == ("idle", "0x800")
