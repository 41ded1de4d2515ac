"""What a finding costs in GPU-hours (core-hours on a CPU run) and money: one figure in every place it shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputop.cli import main
from gputop.diagnose.alerts import Alert
from gputop.export.metrics import families
from gputop.model.figures import SPAN_S, summarize
from tests.support.diagnose_fixtures import CUDA_STRAGGLER, findings_of, make_snapshot, two_ranks
from tests.support.recordings import record


def test_a_straggler_on_two_gpus_idles_its_share_of_both() -> None:
    (straggler, *_) = findings_of(make_snapshot(CUDA_STRAGGLER, seconds=20.0, age_s=3600.0))
    assert straggler.cause == "straggler" and straggler.waste is not None
    share = straggler.cost_s / straggler.step_s
    assert straggler.waste.unit == "GPU" and straggler.waste.devices == 2
    assert straggler.waste.per_hour == pytest.approx(2 * share)
    assert straggler.waste.so_far == pytest.approx(2 * share * 1.0, rel=0.01)  # seen for an hour
    assert f"wastes about {2 * share:.2g} GPU-hours an hour" in straggler.worth_text
    priced = straggler.to_dict(price_per_hour=2.5)["waste"]
    assert priced["money_per_hour"] == pytest.approx(2.5 * 2 * share, abs=0.01)
    assert f"{2.5 * 2 * share:,.2f} an hour at 2.50 per GPU-hour" in straggler.worth(2.5)


def test_a_cpu_run_counts_the_cores_it_keeps_busy_and_is_not_priced_per_gpu_hour() -> None:
    (finding, *_) = findings_of(make_snapshot(two_ranks(loader_frac=0.4, cpu_pct=90.0)))
    assert finding.cause == "data_loading" and finding.waste is not None
    assert finding.waste.unit == "core" and finding.waste.devices == pytest.approx(1.8)
    assert "core-hours an hour" in finding.worth_text
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
    assert payload["finding"]["waste"]["money_per_hour"] == pytest.approx(3.0 * straggler.waste.per_hour, abs=0.01)
    family = {f.spec.name: f for f in families(figures, [straggler], gpu_hostname="node0")}[
        "gputop_finding_waste_per_hour"
    ]
    ((labels, value),) = family.samples
    assert labels[0] == "straggler" and labels[-1] == "GPU" and value == pytest.approx(straggler.waste.per_hour)
