"""Every fake-NVML scenario, recorded with a rank on it, renders in `gputop report` (text, markdown, json)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from gputop import cli, recording
from gputop.collect.gpu import GpuSampler
from gputop.collect.nvml import Nvml
from gputop.protocol import Hello, Window
from tests.fake_nvml import NVML_ERROR_LIBRARY_NOT_FOUND, FakeGpu, FakeNvml, FakeProcess, make_gpus

RANK_PID = 4242


def eight_gpus() -> FakeNvml:
    gpus = make_gpus(8)
    gpus[0].processes = [FakeProcess(pid=RANK_PID), FakeProcess(pid=777)]  # 777: someone else's job
    return FakeNvml(gpus)


def one_lost_mid_run() -> FakeNvml:
    return FakeNvml(make_gpus(2))


def not_supported() -> FakeNvml:
    gpu = FakeGpu(uuid="GPU-00000000-0000-0000-0000-000000000000", name="Tesla T4")
    gpu.unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetPcieThroughput", "nvmlDeviceGetTotalEccErrors"}
    return FakeNvml([gpu])


def mig() -> FakeNvml:
    instance = FakeGpu(uuid="MIG-aaaa", name="NVIDIA A100 MIG 3g.40gb", processes=[FakeProcess(pid=RANK_PID)])
    return FakeNvml([FakeGpu(uuid="GPU-00000000-0000-0000-0000-000000000000", mig=[instance])])


def no_driver() -> FakeNvml:
    return FakeNvml(make_gpus(1), init_error=NVML_ERROR_LIBRARY_NOT_FOUND)


def vanished_process() -> FakeNvml:
    gpus = make_gpus(1)
    gpus[0].processes = [FakeProcess(pid=999_999_999)]  # no such pid on this machine
    return FakeNvml(gpus)


SCENARIOS: dict[str, Callable[[], FakeNvml]] = {
    "eight_gpus": eight_gpus,
    "one_lost_mid_run": one_lost_mid_run,
    "not_supported": not_supported,
    "mig": mig,
    "no_driver": no_driver,
    "vanished_process": vanished_process,
}


def record_scenario(path, backend: FakeNvml) -> None:
    clock = iter(float(t) for t in range(100, 1000))
    sampler = GpuSampler(Nvml(backend), clock=lambda: next(clock))
    first = backend.gpus[0] if backend.gpus else None
    uuid = first.mig[0].uuid if first is not None and first.mig else (first.uuid if first else None)
    rec = recording.Recorder(path, source="test")
    rec.message(Hello(run_id="job", rank=0, pid=RANK_PID, device="cuda:0", device_uuid=uuid), 100.0)
    for seq in range(1, 7):
        if seq == 4 and len(backend.gpus) == 2:
            backend.gpus[1].lost = True  # "GPU is lost" from here on
        rec.sample(sampler.sample())
        rec.message(Window(run_id="job", rank=0, seq=seq, t0=100 + seq, t1=100.5 + seq, steps=3,
                           step_total=3 * seq, step_time_sum_s=0.3), 100.5 + seq)  # fmt: skip
    rec.close()
    sampler.close()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_scenario_renders_in_every_format(tmp_path, capsys, scenario: str) -> None:
    path = tmp_path / f"{scenario}.jsonl"
    record_scenario(path, SCENARIOS[scenario]())
    outputs = {}
    for fmt in ("text", "markdown", "json"):
        assert cli.main(["report", str(path), "--format", fmt]) == 0
        outputs[fmt] = capsys.readouterr().out
    gpus = json.loads(outputs["json"])["gpus"]
    if scenario == "no_driver":
        assert gpus["unavailable"] and "NVML" in outputs["text"]
        return
    assert gpus["gpus"], gpus
    for fmt in ("text", "markdown"):
        assert "GPU" in outputs[fmt]
    by_uuid = {g["uuid"]: g for g in gpus["gpus"]}
    if scenario == "eight_gpus":
        assert len(by_uuid) == 8
        first = next(g for g in gpus["gpus"] if g["index"] == 0)
        assert [r["rank"] for r in first["ranks"]] == [0]
        assert 777 in [p["pid"] for p in first["unobserved"]]
    if scenario == "mig":
        assert [r["rank"] for r in by_uuid["MIG-aaaa"]["ranks"]] == [0]


def test_a_gpu_lost_mid_run_is_not_called_idle(tmp_path, capsys) -> None:
    path = tmp_path / "lost.jsonl"
    record_scenario(path, one_lost_mid_run())
    assert cli.main(["report", str(path), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert not [f for f in report["findings"] if "idle" in f["title"]]
    lost = next(g for g in report["gpus"]["gpus"] if g["index"] == 1)
    assert "lost" in json.dumps(lost).lower()
