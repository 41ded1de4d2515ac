"""The Prometheus endpoint: names by the conventions, every metric documented, a real Prometheus scrapes it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gputop.diagnose import diagnose
from gputop.export.metrics import METRICS, families
from gputop.model.figures import summarize
from tests.conftest import needs_torch, torchrun
from tests.diagnose_fixtures import RankSpec, cuda_hello, gpu_reading, make_snapshot
from tests.prometheus_server import Prometheus

DOCS = Path(__file__).parent.parent / "docs" / "prometheus.md"
UNIT_SUFFIXES = ("_seconds", "_bytes", "_ratio", "_watts", "_celsius", "_total", "_info", "_per_second")
PROMETHEUS_PORT = 32090
EXPORTER_PORT = 32091


def stop_job(job: subprocess.Popen[str]) -> None:
    """SIGTERM torchrun, which stops its ranks (a SIGKILL would orphan them on our pipe)."""
    job.terminate()
    try:
        job.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        job.kill()
        job.communicate(timeout=30)


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


def test_the_shipped_scrape_config_alert_rules_and_grafana_queries_are_valid(tmp_path: Path) -> None:
    """promtool (from Debian's prometheus package) parses the config, the rules and every panel's PromQL."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: apt-get install prometheus (.ci/run installs it)")
    folder = DOCS.parent / "prometheus"
    for args in (["check", "config", "prometheus.yml"], ["check", "rules", "gputop-alerts.yml"]):
        done = subprocess.run([promtool, *args], cwd=folder, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
    dashboard = json.loads((DOCS.parent / "grafana" / "gputop-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    rules = tmp_path / "panels.yml"
    rules.write_text(
        "groups:\n  - name: panels\n    rules:\n"
        + "".join(
            f"      - record: panel_{i}\n        expr: {json.dumps(e.replace('$', ''))}\n" for i, e in enumerate(exprs)
        )
    )
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert all(
        name in " ".join(exprs) for name in ("gputop_finding", "gputop_step_time_seconds", "DCGM_FI_DEV_GPU_UTIL")
    )


def test_a_value_not_measured_is_left_out_not_zero() -> None:
    snapshot = make_snapshot([RankSpec(rank=0, loader_frac=None, forward_frac=None)])
    by_name = {f.spec.name: f for f in families(summarize(snapshot), [], gpu_hostname="h")}
    assert by_name["gputop_loader_wait_ratio"].samples == ()
    assert by_name["gputop_memory_allocated_bytes"].samples == ()
    assert len(by_name["gputop_step_time_mean_seconds"].samples) == 1


@pytest.mark.slow
@needs_torch
def test_a_real_prometheus_scrapes_the_recorders_endpoint(tmp_path: Path) -> None:
    """`gputop record --prometheus`, a 2-rank job: PromQL over Prometheus's HTTP API returns both step times."""
    port = 32092
    recorder = subprocess.Popen(
        [sys.executable, "-m", "gputop", "record", "--port", str(port), "--seconds", "120",
         "-o", str(tmp_path / "run.jsonl"), "--prometheus", f"127.0.0.1:{EXPORTER_PORT}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    prometheus = Prometheus([f"127.0.0.1:{EXPORTER_PORT}"], tmp_path, PROMETHEUS_PORT)
    job = None
    try:
        prometheus.wait_ready()
        job = torchrun("ddp_job.py", "--steps", "100000", "--delay-ms", "10", port=port)  # stopped below
        deadline = time.monotonic() + 90
        result: list[dict[str, object]] = []
        while time.monotonic() < deadline and len(result) < 2:
            time.sleep(1)
            result = prometheus.query('gputop_step_time_mean_seconds{job="gputop"}')
        assert len(result) == 2, f"PromQL returned {result}; prometheus log: {prometheus.log.read_text()[-1500:]}"
        ranks = sorted(r["metric"]["rank"] for r in result)  # type: ignore[index]
        assert ranks == ["0", "1"]
        for r in result:
            value = float(r["value"][1])  # type: ignore[index]
            assert 0.005 < value < 5, f"rank {r['metric']} step time {value} s"  # type: ignore[index]
            assert r["metric"]["Hostname"]  # type: ignore[index]
        rate: list[dict[str, object]] = []
        # rate() needs two scrapes that saw the counter move (the exporter refreshes every 2 s).
        while time.monotonic() < deadline and (len(rate) < 2 or any(float(r["value"][1]) == 0 for r in rate)):  # type: ignore[index]
            time.sleep(1)
            rate = prometheus.query("rate(gputop_steps_total[30s])")
        assert rate and all(float(r["value"][1]) > 0 for r in rate), rate  # type: ignore[index]
        with urllib.request.urlopen(f"http://127.0.0.1:{EXPORTER_PORT}/metrics", timeout=5) as response:
            exposition = response.read().decode()
        assert "# TYPE gputop_steps_total counter" in exposition
    finally:
        if job is not None:
            stop_job(job)
        prometheus.stop()
        recorder.terminate()
        out, _ = recorder.communicate(timeout=30)
    assert "Prometheus metrics on :32091/metrics" in out, out
