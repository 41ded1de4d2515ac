"""`gputop fleet`'s reads of Prometheus: its errors, each a line a user can act on, the runs with where their
slow ranks run, and how often to read again; from real sockets and real HTTP servers."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from gputop.cli.fleet import run_lines
from gputop.fleet.query import (
    DEFAULT_INTERVAL_S,
    FleetError,
    FleetRun,
    Prometheus,
    missing_reasons,
    parse_duration,
    read_fleet,
    read_scraping,
)
from tests.support.processes import free_port
from tests.support.prometheus_api import PrometheusAPI, rank_labels, record_two_rank_run, sample, target


@pytest.fixture
def not_prometheus() -> Iterator[str]:
    """A web server that is not Prometheus: every path is 404."""

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_that_is_not_there_is_said_with_its_address() -> None:
    port = free_port()  # nothing listens there
    done = subprocess.run([sys.executable, "-m", "gputop", "fleet", f"127.0.0.1:{port}"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1, done
    assert done.stderr == f"gputop: cannot reach Prometheus at http://127.0.0.1:{port}: Connection refused\n"


def test_a_web_server_that_is_not_prometheus_is_told_apart(not_prometheus: str) -> None:
    with pytest.raises(FleetError, match=r"answered HTTP 404 to a query: is it Prometheus\?"):
        read_fleet(Prometheus(not_prometheus))


@pytest.mark.parametrize("url", ["ftp://host:9090", "http://"])
def test_an_address_that_is_no_web_address_is_refused_before_any_connection(url: str) -> None:
    with pytest.raises(FleetError, match="is not a Prometheus address: give one as http://HOST:9090"):
        Prometheus(url)


@pytest.fixture
def api() -> Iterator[PrometheusAPI]:
    """A Prometheus HTTP API on loopback that knows nothing until the test records it."""
    server = PrometheusAPI().start()
    yield server
    server.stop()


def test_a_slow_rank_and_an_alert_say_which_exporter_to_open(api: PrometheusAPI) -> None:
    record_two_rank_run(api, "10.0.0.7:9465")
    (run,) = read_fleet(Prometheus(api.url))
    assert [(s.rank, s.hostname, s.instance, round(s.score, 2)) for s in run.slowest] == [
        ("1", "node-a", "10.0.0.7:9465", 0.21),
        ("0", "node-a", "10.0.0.7:9465", -0.02),
    ]
    # The firing one first; the straggler's names its rank's exporter, the run's loader alert none.
    assert [(a.name, a.rank, a.instance) for a in run.alerts] == [
        ("GputopJobLoaderBoundCritical", "", ""),
        ("GputopJobStraggler", "1", "10.0.0.7:9465"),
    ]


def test_the_refresh_is_the_scrape_interval_of_the_jobs_that_carry_gputop(api: PrometheusAPI) -> None:
    api.answers["count by (job) (gputop_rank_up)"] = [sample(8, job="gputop"), sample(2, job="lab")]
    api.targets = [
        target("gputop", "10.0.0.7:9465", interval="30s"),
        target("lab", "10.0.0.9:9465", interval="1m30s", scheme="https"),
        target("node", "10.0.0.7:9100", interval="5s"),  # node_exporter: faster, but no gputop series
    ]
    scraping = read_scraping(Prometheus(api.url))
    assert (scraping.interval_s, scraping.known) == (30.0, True)
    assert scraping.said == "the scrape interval of job 'gputop'"
    # Where each gputop exporter is scraped, scheme and all: the node screen reads it there.
    assert scraping.metrics_urls == {
        "10.0.0.7:9465": "http://10.0.0.7:9465/metrics",
        "10.0.0.9:9465": "https://10.0.0.9:9465/metrics",
    }


def test_an_interval_prometheus_cannot_give_is_15_s_with_the_reason(api: PrometheusAPI) -> None:
    assert DEFAULT_INTERVAL_S == 15.0
    nothing = read_scraping(Prometheus(api.url))
    assert (nothing.interval_s, nothing.known) == (15.0, False)
    assert nothing.said.endswith(": no scrape job carries gputop's series yet"), nothing.said

    api.answers["count by (job) (gputop_rank_up)"] = [sample(8, job="gputop")]
    api.targets = [target("gputop", "10.0.0.7:9465", interval=None)]
    older = read_scraping(Prometheus(api.url))
    assert (older.interval_s, older.known) == (15.0, False)
    assert "its targets API does not give one" in older.said, older.said

    port = free_port()
    gone = read_scraping(Prometheus(f"127.0.0.1:{port}"))
    assert (gone.interval_s, gone.known) == (15.0, False)
    assert gone.said == (
        f"Prometheus's scrape interval unknown, 15 s assumed: cannot reach Prometheus at http://127.0.0.1:{port}: "
        "Connection refused"
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15s", 15.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0), ("0s", None), ("15", None), ("", None),
     ("1.5s", None), ("s15", None), (None, None)],
)  # fmt: skip
def test_a_scrape_interval_reads_as_prometheus_writes_durations(text: str | None, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


def test_each_figure_prometheus_had_no_value_for_says_why() -> None:
    run = FleetRun("run-a", ranks=2, step_s=0.05, steps_per_s=20.0, loader_wait=0.0, idle_gpu_hours_per_hour=0.3)
    reasons = missing_reasons(run)
    assert list(reasons) == ["exposed_comm", "mfu"], reasons  # a measured 0% loader wait is no N/A
    assert "gputop.watch(model)" in reasons["exposed_comm"]
    assert "docs/mfu.md" in reasons["mfu"]


def test_printed_once_when_stdout_is_no_terminal(api: PrometheusAPI) -> None:
    record_two_rank_run(api, "10.0.0.7:9465")
    done = subprocess.run([sys.executable, "-m", "gputop", "fleet", api.url], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == (
        "run run-a: 2 ranks, step 50.0 ms, 20.0 steps/s, loader 23%, MFU 41.0% (the median rank), "
        "0.3 idle GPU-hours an hour"
    )
    assert "rank 1 on node-a +21%" in done.stdout


def test_a_nan_from_a_rule_over_no_data_is_na_not_a_number(api: PrometheusAPI) -> None:
    record_two_rank_run(api, "10.0.0.7:9465")
    api.answers["run:gputop_loader_wait:ratio"] = [sample(float("nan"), run="run-a")]
    (run,) = read_fleet(Prometheus(api.url))
    assert run.loader_wait is None and "loader_wait" in missing_reasons(run)


def test_a_hung_run_with_no_step_in_its_span_is_listed_with_its_alert(api: PrometheusAPI) -> None:
    """A run none of whose ranks stepped lately has no median step: it is known by its ranks that report."""
    record_two_rank_run(api, "10.0.0.7:9465")
    api.answers["run:gputop_ranks_reporting"].append(sample(8, __name__="run:gputop_ranks_reporting", run="run-h"))
    api.answers["count by (run) (gputop_rank_up)"].append(sample(8, run="run-h"))
    api.answers["run:gputop_steps_per_second"].append(sample(0, __name__="run:gputop_steps_per_second", run="run-h"))
    hang = {"alertname": "GputopJobHang", "alertstate": "firing", "severity": "critical", "cause": "hang"}
    api.answers['ALERTS{alertname=~"Gputop.*"}'].append(sample(1, __name__="ALERTS", run="run-h", **hang))
    runs = {run.run: run for run in read_fleet(Prometheus(api.url))}
    hung, other = runs["run-h"], runs["run-a"]
    assert (hung.run, hung.ranks, hung.step_s, [a.name for a in hung.alerts]) == ("run-h", 8, None, ["GputopJobHang"])
    # Its per-step figures are N/A because no rank stepped, not for want of a hook.
    assert missing_reasons(hung)["step_s"].startswith("median step: no rank of the run took a step"), hung
    assert other.step_s == 0.05


def test_a_runs_lost_ranks_are_counted_and_printed(api: PrometheusAPI) -> None:
    """Ranks their exporter lost (silent, or gone without a bye: gputop_rank_up 0) are said beside the count."""
    record_two_rank_run(api, "10.0.0.7:9465")
    api.answers["count by (run) (gputop_rank_up == 0)"] = [sample(1, run="run-a")]
    (run,) = read_fleet(Prometheus(api.url))
    assert (run.ranks, run.lost) == (2, 1)
    assert run_lines(run)[0].startswith("run run-a: 2 ranks (1 lost), step 50.0 ms"), run_lines(run)


def test_a_runs_finished_failed_and_lost_ranks_are_told_apart_in_the_run_the_line_and_the_json(
    api: PrometheusAPI,
) -> None:
    """Each rank's bye (gputop_rank_ended's how): a normal exit reads finished, a SIGTERM stopped (a cancellation,
    or a hung job killed: never "finished"), an exception failed; a rank gone without a bye is lost
    (gputop_rank_up 0).  A run whose ranks all ended is listed by them."""
    record_two_rank_run(api, "10.0.0.7:9465")
    api.answers["count by (run) (gputop_rank_up)"].append(sample(8, run="run-e"))
    api.answers["count by (run) (gputop_rank_up == 0)"] = [sample(1, run="run-e")]
    api.answers["count by (run, how) (gputop_rank_ended)"] = [
        sample(2, run="run-e", how="exit"),
        sample(3, run="run-e", how="signal"),  # cancelled: scancel's SIGTERM
        sample(2, run="run-e", how="exception"),
    ]
    runs = {run.run: run for run in read_fleet(Prometheus(api.url))}
    ended, live = runs["run-e"], runs["run-a"]
    assert (ended.ranks, ended.finished, ended.stopped, ended.failed, ended.lost) == (8, 2, 3, 2, 1), ended
    assert (live.finished, live.stopped, live.failed, live.lost, live.ended_text()) == (0, 0, 0, 0, "")
    assert run_lines(ended)[0] == "run run-e: 8 ranks (2 finished, 3 stopped, 2 failed, 1 lost)", run_lines(ended)
    assert missing_reasons(ended)["step_s"].startswith("median step: every rank of the run has ended"), ended
    done = subprocess.run([sys.executable, "-m", "gputop", "fleet", api.url, "--format", "json"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    as_json = {r["run"]: r for r in json.loads(done.stdout)["runs"]}
    assert {k: as_json["run-e"][k] for k in ("ranks", "finished", "stopped", "failed", "lost")} == {
        "ranks": 8, "finished": 2, "stopped": 3, "failed": 2, "lost": 1
    }, done.stdout  # fmt: skip


def test_the_collective_each_slow_rank_reaches_last_is_read_and_printed(api: PrometheusAPI) -> None:
    """An FSDP2 run: rank 1 reaches the all-gathers last and the others wait 11 ms a step there; rank 0 reaches
    the reduce-scatters last by 0.4 ms.  Each is read with its rank, the longest wait first, beside the slow ranks."""
    record_two_rank_run(api, "10.0.0.7:9465")
    ranks = {rank: rank_labels("run-a", rank, "10.0.0.7:9465") for rank in (0, 1)}
    api.answers["gputop:collective_last_to_arrive"] = [
        sample(0.025, __name__="gputop:collective_last_to_arrive", kind="all_gather", group="dp", part="exposed",
               **ranks[1]),
        sample(0.010, __name__="gputop:collective_last_to_arrive", kind="reduce_scatter", group="dp", part="exposed",
               **ranks[0]),
    ]  # fmt: skip
    api.answers["run_kind_group:gputop_collective_wait_for_last:seconds"] = [
        sample(0.011, __name__="run_kind_group:gputop_collective_wait_for_last:seconds", run="run-a",
               kind="all_gather", group="dp"),
        sample(0.0004, __name__="run_kind_group:gputop_collective_wait_for_last:seconds", run="run-a",
               kind="reduce_scatter", group="dp"),
    ]  # fmt: skip
    (run,) = read_fleet(Prometheus(api.url))
    assert [(w.kind, w.rank, round(w.wait_s, 4)) for w in run.waits] == [
        ("all_gather", "1", 0.011),
        ("reduce_scatter", "0", 0.0004),
    ]
    last = run.last_in("1", "node-a")
    assert last is not None and (last.kind, last.group) == ("all_gather", "dp")
    assert (
        "last to arrive (the rank the others wait for in each collective): all_gather on dp: rank 1 on node-a, "
        "the others 11.0 ms a step" in "\n".join(run_lines(run))
    )
