"""The GPU section of ``gputop report``: per-GPU figures over a run, and their text lines."""

from __future__ import annotations

import json

from gputop.collect.gpu.nvml import GPU_LOST, NOT_SUPPORTED
from gputop.collect.store import Store
from gputop.model.gpu_summary import summarize_gpus
from gputop.model.samples import GpuProcess, GpuReading, GpuSample
from gputop.protocol import Hello
from gputop.report.gpus import format_gpu_summary_text


def reading(index: int, util: float, mem_gb: int, power_w: float, *pids: int) -> GpuReading:
    return GpuReading(
        index=index,
        uuid=f"GPU-{index}",
        name="NVIDIA A100-SXM4-40GB",
        util_pct=util,
        mem_used_bytes=mem_gb << 30,
        mem_total_bytes=40 << 30,
        power_w=power_w,
        power_limit_w=400.0,
        throttle_reasons=("power cap",) if power_w > 350 else (),
        processes=tuple(GpuProcess(pid=p, used_bytes=mem_gb << 30, name="python") for p in pids),
        na={"sm_active_pct": "GPM not supported (Hopper and newer only)"},
    )


def run() -> tuple[list[GpuSample], Store]:
    samples = [
        GpuSample(t=1.0, gpus=(reading(0, 20, 10, 100, 10), reading(1, 0, 1, 60, 4242)), driver_version="550.54"),
        GpuSample(t=2.0, gpus=(reading(0, 90, 30, 380, 10), reading(1, 0, 2, 60, 4242)), driver_version="550.54"),
        GpuSample(t=3.0, gpus=(reading(0, 40, 20, 180, 10), reading(1, 0, 1, 60)), driver_version="550.54"),
    ]
    store = Store()
    store.ingest(Hello(run_id="job", rank=0, pid=10, device_uuid="GPU-0", hostname="n1"), now=0.0)
    return samples, store


class TestSummary:
    def test_per_gpu_figures_and_ranks(self) -> None:
        samples, store = run()
        summary = summarize_gpus(samples, store.snapshot(3.0))
        assert summary["unavailable"] is None and summary["driver_version"] == "550.54"
        first, second = summary["gpus"]
        assert first["util_mean_pct"] == 50.0 and first["util_max_pct"] == 90.0
        assert first["mem_peak_bytes"] == 30 << 30 and first["mem_total_bytes"] == 40 << 30
        assert first["power_mean_w"] == 220.0 and first["power_max_w"] == 380.0 and first["power_limit_w"] == 400.0
        assert round(first["throttle_share_pct"]["power cap"]) == 33
        assert first["ranks"] == [{"run_id": "job", "rank": 0, "hostname": "n1"}]
        assert first["unobserved"] == []
        assert second["ranks"] == []
        assert second["unobserved"] == [{"pid": 4242, "name": "python", "max_used_bytes": 2 << 30}]
        assert second["na"] == {"sm_active_pct": "GPM not supported (Hopper and newer only)"}
        json.dumps(summary)  # the report's json format prints it as is

    def test_without_snapshot_there_are_no_ranks(self) -> None:
        samples, _ = run()
        assert all(g["ranks"] == [] for g in summarize_gpus(samples, None)["gpus"])

    def test_with_no_rank_recorded_every_gpu_still_lists_its_processes(self) -> None:
        """Nothing reported, something on the GPUs: the report says what, in text and JSON."""
        samples, _ = run()
        for snapshot in (Store().snapshot(3.0), None):
            first, second = summarize_gpus(samples, snapshot)["gpus"]
            assert first["ranks"] == [] and first["unobserved"] == [{"pid": 10, "name": "python",
                                                                        "max_used_bytes": 30 << 30}]  # fmt: skip
            assert second["unobserved"] == [{"pid": 4242, "name": "python", "max_used_bytes": 2 << 30}]
        text = "\n".join(format_gpu_summary_text(summarize_gpus(samples, None)))
        assert "pid 4242" in text and "pid 10" in text, text

    def test_never_any_gpu_data_says_why(self) -> None:
        reason = "NVML unavailable: libnvidia-ml not found (no NVIDIA driver installed)"
        summary = summarize_gpus([GpuSample(t=1.0, unavailable=reason)] * 3, None)
        assert summary["gpus"] == [] and summary["unavailable"] == reason
        assert format_gpu_summary_text(summary) == [f"GPUs: no data ({reason})"]
        assert summarize_gpus([], None)["unavailable"] == "no GPU samples were recorded"

    def test_gpu_lost_mid_run_keeps_its_earlier_figures(self) -> None:
        samples, _ = run()
        lost = GpuReading(index=1, uuid="GPU-1", na={"gpu": GPU_LOST})
        samples.append(GpuSample(t=4.0, gpus=(samples[-1].gpus[0], lost)))
        second = summarize_gpus(samples, None)["gpus"][1]
        assert second["samples"] == 4
        assert second["power_max_w"] == 60.0
        assert second["na"]["gpu"] == GPU_LOST

    def test_field_never_read_is_na_not_zero(self) -> None:
        refused = GpuReading(index=0, uuid="GPU-0", mem_used_bytes=1, na={"power_w": NOT_SUPPORTED})
        (only,) = summarize_gpus([GpuSample(t=1.0, gpus=(refused,))], None)["gpus"]
        assert only["power_mean_w"] is None and only["na"]["power_w"] == NOT_SUPPORTED


class TestText:
    def test_lines(self) -> None:
        samples, store = run()
        lines = format_gpu_summary_text(summarize_gpus(samples, store.snapshot(3.0)))
        assert lines[0] == "GPUs (3 samples, driver 550.54)"
        assert "GPU 0" in lines[1] and "util 50% mean / 90% max" in lines[1]
        assert "mem peak 30.0 / 40.0 GiB" in lines[1] and "power 220 W mean / 380 W max of 400 W" in lines[1]
        assert lines[1].endswith("ranks: job r0")
        assert "power cap 33%" in lines[2]
        text = "\n".join(lines)
        assert "not a rank: pid 4242 (python, 2.0 GiB)" in text
        assert "GPM" not in text  # pre-Hopper: no GPM line, no GPM N/A noise
