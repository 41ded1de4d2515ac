"""What a finding costs in GPU-hours (core-hours on a CPU run) and money: one figure in every place it shows."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gputop import report
from gputop.cli import main
from gputop.diagnose.alerts import Alert
from gputop.diagnose.findings import Finding
from gputop.diagnose.wording import hours_text
from gputop.export.metrics import families
from gputop.model.figures import SPAN_S, summarize
from gputop.model.samples import GpuSample
from gputop.tui.view import build_view
from tests.support.diagnose_fixtures import (
    CUDA_STRAGGLER,
    RankSpec,
    cuda_hello,
    findings_of,
    gpu_reading,
    make_snapshot,
    two_ranks,
)
from tests.support.recordings import record


def share_of_step(finding: Finding) -> float:
    assert finding.cost_s is not None and finding.step_s is not None
    return finding.cost_s / finding.step_s


def said(text: str | None) -> str:
    assert text is not None
    return text


def test_a_straggler_on_two_gpus_idles_its_share_of_both() -> None:
    (straggler, *_) = findings_of(make_snapshot(CUDA_STRAGGLER, seconds=20.0, age_s=3600.0))
    assert straggler.cause == "straggler" and straggler.waste is not None
    share = share_of_step(straggler)
    assert straggler.waste.unit == "GPU" and straggler.waste.devices == 2
    assert straggler.waste.per_hour == pytest.approx(2 * share)
    assert straggler.waste.so_far == pytest.approx(2 * share * 1.0, rel=0.01)  # seen for an hour
    assert f"wastes about {2 * share:.2g} GPU-hours an hour" in said(straggler.worth_text)
    assert hours_text(0.0049) == "0.0049" and hours_text(2.345) == "2.3" and hours_text(125.0) == "125"
    priced = straggler.to_dict(price_per_hour=2.5)["waste"]
    assert priced["money_per_hour"] == pytest.approx(2.5 * 2 * share, abs=0.01)
    assert f"{2.5 * 2 * share:,.2f} an hour at 2.50 per GPU-hour" in said(straggler.worth(2.5))


def test_a_cpu_run_counts_the_cores_it_keeps_busy_and_is_not_priced_per_gpu_hour() -> None:
    (finding, *_) = findings_of(make_snapshot(two_ranks(loader_frac=0.4, cpu_pct=90.0)))
    assert finding.cause == "data_loading" and finding.waste is not None
    assert finding.waste.unit == "core" and finding.waste.devices == pytest.approx(1.8)
    assert "core-hours an hour" in said(finding.worth_text)
    assert "money_per_hour" not in finding.to_dict(price_per_hour=2.5)["waste"]


def test_the_report_the_alert_and_the_exporter_say_the_same_waste(tmp_path: Path, capsys) -> None:
    path = record(tmp_path / "run.jsonl", CUDA_STRAGGLER)
    assert main(["report", str(path), "--format", "json", "--gpu-hour-price", "3"]) == 0
    reported = json.loads(capsys.readouterr().out)["findings"][0]
    assert reported["cause"] == "straggler" and reported["waste"]["unit"] == "GPU"
    assert "per GPU-hour" in reported["worth"]

    snapshot = make_snapshot(CUDA_STRAGGLER, seconds=20.0)
    figures = summarize(snapshot, span_s=SPAN_S)
    straggler = findings_of(snapshot)[0]
    payload = Alert("raised", straggler, figures.t, 30.0).to_dict(3.0)
    assert straggler.waste is not None
    assert payload["finding"]["waste"]["money_per_hour"] == pytest.approx(3.0 * straggler.waste.per_hour, abs=0.01)
    family = {f.spec.name: f for f in families(figures, [straggler], gpu_hostname="node0")}[
        "gputop_finding_waste_per_hour"
    ]
    ((labels, value),) = family.samples
    assert labels[0] == "straggler" and labels[-1] == "GPU" and value == pytest.approx(straggler.waste.per_hour)


# The straggler's two GPUs, busy 60% and 80% of the span: 0.4 + 0.2 GPU-hours idle every hour.
BUSY_GPUS = [gpu_reading(0, util_pct=60.0), gpu_reading(1, util_pct=80.0)]


def test_a_cpu_run_has_no_idle_gpu_hours() -> None:
    snapshot = make_snapshot(two_ranks(loader_frac=0.4, cpu_pct=90.0))
    (run,) = report.build(summarize(snapshot, span_s=SPAN_S))["runs"]
    assert run["idle_gpus"] is None and "sit idle" not in report.render(snapshot, "text")


def test_the_price_in_the_config_file_is_every_commands_default(tmp_path: Path, capsys, monkeypatch) -> None:
    path = record(tmp_path / "run.jsonl", CUDA_STRAGGLER)
    (tmp_path / "gputop").mkdir()
    (tmp_path / "gputop" / "config.toml").write_text("gpu_hour_price = 4\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert main(["report", str(path), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"][0]["waste"]["price_per_hour"] == 4.0
    assert main(["report", str(path), "--format", "json", "--gpu-hour-price", "2"]) == 0  # the option wins
    assert json.loads(capsys.readouterr().out)["findings"][0]["waste"]["price_per_hour"] == 2.0


def test_a_recordings_idle_gpu_hours_are_the_runs_own_not_the_idle_minutes_around_it() -> None:
    """A recorder started 100 s before torchrun sees the GPUs idle: that is not the run's waste."""
    snapshot = make_snapshot(CUDA_STRAGGLER, seconds=20.0, gpus=BUSY_GPUS)
    before = tuple(
        GpuSample(
            t=snapshot.gpu_history[0].t - 100 + k, gpus=(gpu_reading(0, util_pct=0.0), gpu_reading(1, util_pct=0.0))
        )
        for k in range(90)
    )
    recording = dataclasses.replace(snapshot, gpu_history=before + snapshot.gpu_history)
    (run,) = report.build(summarize(recording, span_s=None))["runs"]
    assert run["idle_gpus"]["gpu_hours_per_hour"] == pytest.approx(0.6), run["idle_gpus"]


def test_two_runs_on_the_same_gpus_count_their_idle_time_once() -> None:
    specs = [RankSpec(rank=0, hello=cuda_hello(0)), RankSpec(rank=1, hello=cuda_hello(1))]
    snapshot = make_snapshot(specs, more_runs={"other": specs}, seconds=20.0, gpus=BUSY_GPUS)
    view = build_view(summarize(snapshot, span_s=SPAN_S))
    assert len(view.runs) == 2 and view.idle_gpus == pytest.approx((0.6, 2))


def test_a_gpu_findings_waste_comes_with_the_energy_its_share_of_the_gpus_draws() -> None:
    """Two GPUs drawing 300 W and 200 W: the straggler's share of their 0.5 kW, in kWh every hour and so far."""
    powered = [dataclasses.replace(gpu_reading(0), power_w=300.0), dataclasses.replace(gpu_reading(1), power_w=200.0)]
    (straggler, *_) = findings_of(make_snapshot(CUDA_STRAGGLER, seconds=20.0, age_s=3600.0, gpus=powered))
    assert straggler.cause == "straggler" and straggler.waste is not None
    share = share_of_step(straggler)
    assert straggler.waste.kwh_per_hour == pytest.approx(0.5 * share)
    assert straggler.waste.kwh_so_far == pytest.approx(0.5 * share * 1.0, rel=0.01)  # seen for an hour
    assert f"{0.5 * share:.2g} kWh an hour" in said(straggler.worth_text)
    assert straggler.to_dict()["waste"]["kwh_per_hour"] == pytest.approx(0.5 * share, abs=0.001)
    (unpowered, *_) = findings_of(make_snapshot(CUDA_STRAGGLER, seconds=20.0, gpus=BUSY_GPUS))
    assert unpowered.waste is not None and unpowered.waste.kwh_per_hour is None  # no power reading: no energy
    assert "kWh" not in said(unpowered.worth_text)
