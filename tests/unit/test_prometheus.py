"""The Prometheus endpoint: names by the conventions, every metric documented, not-measured left out."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import pytest

from gputop.diagnose import diagnose
from gputop.diagnose.thresholds import HANG_MIN_S, LOADER_WAIT_CRITICAL_FRAC, STRAGGLER_WAIT_WARN_FRAC
from gputop.export.metrics import METRICS, families
from gputop.export.rules import rule_groups, rules_yaml
from gputop.model.figures import summarize
from tests.support.diagnose_fixtures import RankSpec, cuda_hello, gpu_reading, make_snapshot

DOCS = Path(__file__).resolve().parents[2] / "docs" / "prometheus.md"
UNIT_SUFFIXES = ("_seconds", "_bytes", "_ratio", "_watts", "_celsius", "_total", "_info", "_per_second")


def exposed_name(spec_name: str, kind: str) -> str:
    return spec_name + "_total" if kind == "counter" else spec_name


def test_names_follow_prometheus_conventions_and_every_metric_is_documented() -> None:
    text = DOCS.read_text()
    for spec in METRICS:
        name = exposed_name(spec.name, spec.kind)
        assert re.fullmatch(r"gputop_[a-z0-9_]+", name), name
        assert not name.endswith("_pct") and "_ms" not in name, f"{name}: base units only"
        if spec.kind == "counter":
            assert not spec.name.endswith("_total"), "prometheus-client appends _total itself"
        assert f"`{name}`" in text, f"{name} is not documented in docs/prometheus.md"
        # DCGM's spellings, so a PromQL join on UUID/Hostname works without label_replace.
        assert "uuid" not in spec.labels and "hostname" not in spec.labels and "host" not in spec.labels


def test_a_straggler_on_a_cuda_rank_is_exported_with_its_host_rank_and_gpu() -> None:
    specs = [
        RankSpec(rank=0, hello=cuda_hello(0), comm_frac=0.5, overlap_frac=0.05),
        RankSpec(rank=1, hello=cuda_hello(1), step_s=0.1, loader_frac=0.6, comm_frac=0.05, overlap_frac=0.04),
    ]
    snapshot = make_snapshot(specs, gpus=[gpu_reading(0), gpu_reading(1)])
    figures = summarize(snapshot)
    found = diagnose(figures)
    by_name = {f.spec.name: f for f in families(figures, found, gpu_hostname="node0")}
    steps = {dict(zip(f.spec.labels, labels, strict=True))["rank"]: v
             for f in [by_name["gputop_step_time_mean_seconds"]] for labels, v in f.samples}  # fmt: skip
    assert steps.keys() == {"0", "1"} and all(v == pytest.approx(0.1, rel=0.05) for v in steps.values())
    info = by_name["gputop_gpu_rank_info"]
    uuids = {dict(zip(info.spec.labels, labels, strict=True))["UUID"] for labels, _ in info.samples}
    assert uuids == {gpu_reading(0).uuid, gpu_reading(1).uuid}
    finding_labels = [dict(zip(by_name["gputop_finding"].spec.labels, labels, strict=True))
                      for labels, _ in by_name["gputop_finding"].samples]  # fmt: skip
    assert found and len(finding_labels) <= len(found)
    assert {(f.cause, f.severity) for f in found} == {(lbl["cause"], lbl["severity"]) for lbl in finding_labels}
    single = next(lbl for lbl, f in zip(finding_labels, found, strict=False) if len(f.ranks) == 1)
    assert single["Hostname"] == "node0" and single["rank"] in {"0", "1"}


def test_a_value_not_measured_is_left_out_not_zero() -> None:
    snapshot = make_snapshot([RankSpec(rank=0, loader_frac=None, forward_frac=None)])
    by_name = {f.spec.name: f for f in families(summarize(snapshot), [], gpu_hostname="h")}
    assert by_name["gputop_loader_wait_ratio"].samples == ()
    assert by_name["gputop_memory_allocated_bytes"].samples == ()
    assert len(by_name["gputop_step_time_mean_seconds"].samples) == 1


def test_the_hang_clock_is_exported_for_the_ranks_that_report_with_the_hang_rules_own_line() -> None:
    """What the job rules call a hang on: seconds since each reporting rank's last step, and its line."""
    snapshot = make_snapshot([RankSpec(rank=0, step_s=0.1), RankSpec(rank=1, step_s=0.1, status="lost")])
    figures = summarize(snapshot)
    by_name = {f.spec.name: f for f in families(figures, [], gpu_hostname="h")}
    since = {dict(zip(f.spec.labels, labels, strict=True))["rank"]: v
             for f in [by_name["gputop_seconds_since_step"]] for labels, v in f.samples}  # fmt: skip
    lines = [v for _, v in by_name["gputop_hang_line_seconds"].samples]
    assert since.keys() == {"0"}, "a lost rank has no clock: the rules must not call a dead job hung"
    live = next(r for r in figures.all_ranks() if r.rank == 0)
    last_step_t = max(w.t1 for w in live.snapshot.windows if w.steps)
    assert since["0"] == pytest.approx(snapshot.t - last_step_t)
    assert lines == [pytest.approx(HANG_MIN_S)]  # 10 steps of 0.1 s are under the floor


def test_the_shipped_job_rules_are_what_gputop_generates_from_its_thresholds() -> None:
    shipped = DOCS.parent / "prometheus" / "gputop-job-rules.yml"
    assert shipped.read_text() == rules_yaml(), "regenerate: python -m gputop.export.rules > " + str(shipped)
    alerts = {rule["alert"]: rule for group in rule_groups()["groups"] for rule in group["rules"] if "alert" in rule}
    assert alerts["GputopJobStraggler"]["expr"].endswith(f"> {STRAGGLER_WAIT_WARN_FRAC:g}")
    assert alerts["GputopJobLoaderBoundCritical"]["expr"].endswith(f"> {LOADER_WAIT_CRITICAL_FRAC:g}")


def test_each_rank_that_said_bye_is_exported_with_how_it_ended_and_a_lost_one_is_down() -> None:
    """What `gputop fleet` tells finished, failed and lost apart by: gputop_rank_ended's how, gputop_rank_up 0."""
    from gputop.collect.store import Store
    from gputop.protocol import Bye, Hello

    store = Store()
    endings: tuple[tuple[int, Literal["exit", "signal", "exception"] | None], ...] = (
        (0, "exit"), (1, "signal"), (2, "exception"), (3, None), (4, None)
    )  # fmt: skip
    for rank, how in endings:
        store.ingest(Hello(run_id="r", rank=rank, pid=100 + rank), now=10.0)
        if how is not None:
            store.ingest(Bye(run_id="r", rank=rank, t=11.0, how=how, detail="SIGTERM" if how == "signal" else ""), 11.0)
    store.disconnected("r", 3, "connection closed")  # SIGKILL: gone without a bye
    figures = summarize(store.snapshot(12.0))
    by_name = {f.spec.name: f for f in families(figures, [], gpu_hostname="node0")}

    def per_rank(name: str) -> dict[str, tuple[str, ...]]:
        spec = by_name[name].spec
        return {dict(zip(spec.labels, labels, strict=True))["rank"]: (*labels[len(spec.labels) - 1 :], str(v))
                for labels, v in by_name[name].samples}  # fmt: skip

    assert per_rank("gputop_rank_ended") == {
        "0": ("exit", "1.0"), "1": ("signal", "1.0"), "2": ("exception", "1.0")
    }  # fmt: skip
    up = {rank: value for rank, (*_, value) in per_rank("gputop_rank_up").items()}
    assert up == {"0": "1.0", "1": "1.0", "2": "1.0", "3": "0.0", "4": "1.0"}  # rank 4 still reports
