"""The exporter against the real Prometheus tools: promtool checks what is shipped, a real server scrapes a real job."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.collectors import wait_for
from tests.support.processes import launch, needs_torch
from tests.support.prometheus_server import Prometheus

DOCS = Path(__file__).resolve().parents[2] / "docs" / "prometheus.md"
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


def test_fleet_says_in_one_line_that_a_prometheus_scrapes_no_gputop(tmp_path: Path) -> None:
    prometheus = Prometheus([], tmp_path, PROMETHEUS_PORT + 10)
    try:
        prometheus.wait_ready()
        fleet = subprocess.run([sys.executable, "-m", "gputop", "fleet", prometheus.url], capture_output=True,
                               text=True, timeout=60)  # fmt: skip
    finally:
        prometheus.stop()
    assert fleet.returncode == 1 and fleet.stderr.count("\n") == 1, fleet.stderr
    assert f"{prometheus.url} has no gputop series: is it scraping gputop's exporters?" in fleet.stderr


def test_the_job_rules_name_a_straggler_and_a_hang_where_gputops_own_rules_do() -> None:
    """promtool's unit tests of the shipped job rules (tests/prometheus/): a straggler named with its rank and host
    at gputop's lines, a hung run and not a finished one, loader- and communication-bound runs graded."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: apt-get install prometheus (.ci/run installs it)")
    rules = DOCS.parent / "prometheus" / "gputop-job-rules.yml"
    tests = Path(__file__).resolve().parents[1] / "prometheus" / "gputop-job-rules.test.yml"
    for args in (["check", "rules", str(rules)], ["test", "rules", str(tests)]):
        done = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


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
        job = launch("ddp_job.py", "--steps", "100000", "--delay-ms", "10", port=port)  # stopped below
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
        # gputop's series without the job rules: `gputop fleet` says what to load, in one line.
        fleet = subprocess.run([sys.executable, "-m", "gputop", "fleet", prometheus.url], capture_output=True,
                               text=True, timeout=60)  # fmt: skip
        assert fleet.returncode == 1 and fleet.stderr.count("\n") == 1, fleet.stderr
        assert "has gputop's series but not the job rules: load gputop-job-rules.yml" in fleet.stderr
        stopped, job = job, None
        _sigterm_reads_stopped(stopped, prometheus)
    finally:
        if job is not None:
            stop_job(job)
        prometheus.stop()
        recorder.terminate()
        out, _ = recorder.communicate(timeout=30)
    assert "Prometheus metrics on :32091/metrics" in out, out


def _sigterm_reads_stopped(job: subprocess.Popen[str], prometheus: Prometheus) -> None:
    """The job ended by SIGTERM: each rank said so (gputop_rank_ended, how "signal"), none is lost, and `gputop
    fleet` lists the run with its 2 ranks stopped, not finished, though no rank reports any more (and no job rule
    is loaded)."""
    stop_job(job)
    ended: list[dict[str, Any]] = []
    up: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(ended) < 2:
        time.sleep(1)
        ended = prometheus.query("gputop_rank_ended")
        up = prometheus.query("gputop_rank_up")
    seen = f"gputop_rank_ended {[(r['metric']['rank'], r['metric']['how']) for r in ended]}, gputop_rank_up {up}"
    assert sorted((r["metric"]["rank"], r["metric"]["how"]) for r in ended) == [("0", "signal"), ("1", "signal")], seen
    assert [r["value"][1] for r in up] == ["1", "1"], f"a rank ended by SIGTERM read lost: {seen}"
    fleet = subprocess.run([sys.executable, "-m", "gputop", "fleet", prometheus.url, "--format", "json"],
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert fleet.returncode == 0, fleet.stderr
    (run,) = json.loads(fleet.stdout)["runs"]
    assert (run["ranks"], run["finished"], run["stopped"], run["failed"], run["lost"]) == (2, 0, 2, 0, 0), (
        f"{run}; {seen}"
    )


def _steps_by_rank(port: int) -> dict[str, float]:
    """Each rank's gputop_steps_total in the exporter's /metrics ({} while it is not up)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    steps = {}
    for line in text.splitlines():
        if line.startswith("gputop_steps_total{") and (rank := re.search(r'rank="(\d+)"', line)):
            steps[rank[1]] = float(line.rsplit(" ", 1)[1])
    return steps


@pytest.mark.slow
@needs_torch
def test_a_node_agent_that_restarts_gets_its_ranks_back_with_their_step_counters_going_on(tmp_path: Path) -> None:
    """`gputop agent --prometheus` stopped and started again under a running job, as a DaemonSet rolls: the ranks
    reconnect to the new agent on their own, and their step counters carry on from where they were (a counter
    that went back would read to Prometheus as a reset, and rate() would jump)."""
    port, exporter = 32095, 32096
    agent_cmd = [sys.executable, "-m", "gputop", "agent", "--port", str(port), "--prometheus", f"127.0.0.1:{exporter}"]

    def start_agent() -> subprocess.Popen[str]:
        return subprocess.Popen(agent_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    agent = start_agent()
    job = None
    try:
        job = launch("ddp_job.py", "--steps", "100000", "--delay-ms", "10", port=port)  # stopped below
        assert wait_for(lambda: len(_steps_by_rank(exporter)) == 2, timeout_s=90), "the first agent saw no ranks"
        before = _steps_by_rank(exporter)
        agent.terminate()
        assert agent.wait(timeout=30) == 0, agent.communicate()[1]
        agent = start_agent()

        def moved_on() -> bool:
            now = _steps_by_rank(exporter)
            return now.keys() == before.keys() and all(now[r] > before[r] for r in now)

        assert wait_for(moved_on, timeout_s=60), f"before {before}, after {_steps_by_rank(exporter)}"
    finally:
        if job is not None:
            stop_job(job)
        agent.terminate()
        _, said = agent.communicate(timeout=30)
    assert agent.returncode == 0, said
