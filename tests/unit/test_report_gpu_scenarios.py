"""Every stand-in NVML scenario, recorded with a rank on it, renders in `gputop report` (text, markdown, json)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from gputop import cli
from gputop.collect import recording
from gputop.collect.gpu.nvml import Nvml
from gputop.collect.gpu.sampler import GpuSampler
from gputop.protocol import Hello, Window
from tests.support.nvml_standin import Gpu, MigInstance, Process, Scenario, h100_node, use_in_process

RANK_PID = 4242


def eight_gpus() -> Scenario:
    node = h100_node(8)
    node.gpus[0].processes = [Process(pid=RANK_PID), Process(pid=777)]  # 777: someone else's job
    return node


def one_lost_mid_run() -> Scenario:
    return h100_node(2)


def not_supported() -> Scenario:
    refused = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetFieldValues"}
    return Scenario([Gpu(uuid="GPU-00000000-0000-0000-0000-000000000000", name="Tesla T4", unsupported=refused)])


def mig() -> Scenario:
    instance = MigInstance(slot=0, uuid="MIG-aaaa", name="NVIDIA A100 MIG 3g.40gb", processes=[Process(pid=RANK_PID)])
    return Scenario([Gpu(uuid="GPU-00000000-0000-0000-0000-000000000000", mig=[instance])])


def no_driver() -> Scenario:
    return Scenario([], init_error=9)  # NVML_ERROR_DRIVER_NOT_LOADED


def vanished_process() -> Scenario:
    node = h100_node(1)
    node.gpus[0].processes = [Process(pid=999_999_999)]  # no such pid on this machine
    return node


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "eight_gpus": eight_gpus,
    "one_lost_mid_run": one_lost_mid_run,
    "not_supported": not_supported,
    "mig": mig,
    "no_driver": no_driver,
    "vanished_process": vanished_process,
}


def record_scenario(path, scenario: Scenario, tmp_path, monkeypatch) -> None:
    """Six GPU samples through the real bindings over the stand-in, with one rank's windows."""
    where = scenario.write(tmp_path / "nvml-scenario")
    use_in_process(monkeypatch, where)
    clock = iter(float(t) for t in range(100, 1000))
    sampler = GpuSampler(Nvml(), clock=lambda: next(clock))
    first = scenario.gpus[0] if scenario.gpus else None
    uuid = first.mig[0].uuid if first is not None and first.mig else (first.uuid if first else None)
    rec = recording.Recorder(path, source="test")
    rec.message(Hello(run_id="job", rank=0, pid=RANK_PID, device="cuda:0", device_uuid=uuid), 100.0)
    for seq in range(1, 7):
        if seq == 4 and len(scenario.gpus) == 2:
            scenario.gpus[1].lost = True  # "GPU is lost" from here on
            scenario.write(where)
        rec.sample(sampler.sample())
        rec.message(Window(run_id="job", rank=0, seq=seq, t0=100 + seq, t1=100.5 + seq, steps=3,
                           step_total=3 * seq, step_time_sum_s=0.3), 100.5 + seq)  # fmt: skip
    rec.close()
    sampler.close()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_scenario_renders_in_every_format(tmp_path, capsys, monkeypatch, scenario: str) -> None:
    path = tmp_path / f"{scenario}.jsonl"
    record_scenario(path, SCENARIOS[scenario](), tmp_path, monkeypatch)
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


def test_a_gpu_lost_mid_run_is_not_called_idle(tmp_path, capsys, monkeypatch) -> None:
    path = tmp_path / "lost.jsonl"
    record_scenario(path, one_lost_mid_run(), tmp_path, monkeypatch)
    assert cli.main(["report", str(path), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert not [f for f in report["findings"] if "idle" in f["title"]]
    lost = next(g for g in report["gpus"]["gpus"] if g["index"] == 1)
    assert "lost" in json.dumps(lost).lower()
