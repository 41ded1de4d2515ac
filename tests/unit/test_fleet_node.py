"""A node's live detail in `gputop fleet`: its exporter's own page read and parsed, from real exporters.

gputop's own exporter (over fixed data) for what gputop really exports, a
prometheus-client registry for what fixed data cannot give (a finding at work,
a lost rank, a figure not measured), and the ways a read fails, in one line.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from gputop.export.metrics import FINDING_LABELS, GPU_LABELS, METRICS, RANK_LABELS
from gputop.fleet import node
from gputop.fleet.node import NodeFinding, metrics_url, parse_node_page, read_node
from gputop.fleet.query import FleetError
from tests.support.processes import free_port
from tests.support.prometheus_api import exporting_two_ranks


@pytest.fixture
def gputop_exporter() -> Iterator[str]:
    """gputop's own exporter over a 2-rank run on node-a (rank 1 waits for data); its metrics page's URL."""
    with exporting_two_ranks() as instance:
        yield f"http://{instance}/metrics"


def test_every_rank_and_gpu_gputop_exports_is_read_with_its_figures(gputop_exporter: str) -> None:
    page = read_node(gputop_exporter)
    assert [(r.run, r.rank, r.hostname) for r in page.ranks] == [("run-a", "0", "node-a"), ("run-a", "1", "node-a")]
    rank0, rank1 = page.ranks
    assert (rank1.step_s, rank1.steps_per_s, rank1.up) == (0.05, 20.0, 1.0)
    assert rank1.loader_wait == pytest.approx(0.42, abs=0.01) and rank0.loader_wait == pytest.approx(0.04, abs=0.01)
    assert rank0.exposed_comm == pytest.approx(0.24, abs=0.01)
    assert rank0.seconds_since_step is not None
    # Each GPU with the rank joined to it by UUID.
    assert [(g.gpu, g.ranks) for g in page.gpus] == [("0", (("run-a", "0"),)), ("1", (("run-a", "1"),))]
    assert all(g.model == "NVIDIA H100 80GB HBM3" and g.utilization is not None for g in page.gpus)


@pytest.fixture
def hand_made_exporter() -> Iterator[tuple[str, CollectorRegistry]]:
    """An empty prometheus-client registry served on loopback; tests add gputop's metrics to it."""
    registry = CollectorRegistry()
    server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    yield f"http://127.0.0.1:{server.server_port}/metrics", registry
    server.shutdown()
    server.server_close()


def test_a_figure_the_exporter_left_out_is_none_a_lost_rank_and_a_finding_are_read(
    hand_made_exporter: tuple[str, CollectorRegistry],
) -> None:
    url, registry = hand_made_exporter
    up = Gauge("gputop_rank_up", "", RANK_LABELS, registry=registry)
    step = Gauge("gputop_step_time_mean_seconds", "", RANK_LABELS, registry=registry)
    finding = Gauge("gputop_finding", "", FINDING_LABELS, registry=registry)
    rank = {"run": "run-b", "Hostname": "node-c", "UUID": "", "pod": "", "namespace": "", "slurm_job": ""}
    up.labels(**rank, rank="10").set(0)
    up.labels(**rank, rank="2").set(1)
    step.labels(**rank, rank="2").set(0.08)
    finding.labels(cause="straggler", severity="critical", run="run-b", Hostname="node-c", rank="2", gpu="").set(1)
    page = read_node(url)
    assert [r.rank for r in page.ranks] == ["2", "10"]  # in rank order, not the text's
    two, ten = page.ranks
    assert (two.step_s, two.loader_wait, two.up) == (0.08, None, 1.0)  # not measured: None, never 0
    assert (ten.up, ten.step_s) == (0.0, None)
    assert page.findings == (NodeFinding("straggler", "critical", "run-b", "node-c", "2", ""),)
    assert page.gpus == ()


def test_an_exporter_that_is_not_there_is_one_line_with_its_address() -> None:
    port = free_port()
    with pytest.raises(FleetError) as caught:
        read_node(f"http://127.0.0.1:{port}/metrics")
    assert str(caught.value) == f"cannot reach the exporter at http://127.0.0.1:{port}/metrics: Connection refused"


@pytest.fixture
def web_page() -> Iterator[str]:
    """A web server that is no exporter: /metrics is an HTML page, anything else 404."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = b"<html><body>{ not metrics }</body></html>\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_web_server_that_is_no_exporter_is_told_apart(web_page: str) -> None:
    with pytest.raises(FleetError, match=r"/other answered HTTP 404: is it gputop's exporter \(--prometheus\)\?$"):
        read_node(f"{web_page}/other")
    with pytest.raises(FleetError, match=r"/metrics is not a Prometheus metrics page"):
        read_node(f"{web_page}/metrics")


def test_the_page_is_where_prometheus_scrapes_it_else_at_the_instances_metrics() -> None:
    known = {"10.0.0.9:9465": "https://10.0.0.9:9465/gputop/metrics"}
    assert metrics_url("10.0.0.9:9465", known) == "https://10.0.0.9:9465/gputop/metrics"
    assert metrics_url("10.0.0.7:9465", known) == "http://10.0.0.7:9465/metrics"


def test_the_metrics_read_are_those_gputop_exports_with_their_labels() -> None:
    """gputop.fleet may not import gputop.export (it brings the model): the names are written twice, checked here."""
    labels = {spec.name: spec.labels for spec in METRICS}
    for name in node.RANK_FIGURES:
        assert labels.get(name) == RANK_LABELS, name
    for name in node.GPU_FIGURES:
        assert labels.get(name) == GPU_LABELS, name
    assert labels[node.GPU_RANKS] == (*GPU_LABELS, "run", "rank")
    assert labels[node.FINDING] == FINDING_LABELS


def test_a_page_with_no_gputop_series_is_an_empty_node() -> None:
    page = parse_node_page("http://x/metrics", "# HELP up x\n# TYPE up gauge\nup 1\n")
    assert (page.ranks, page.gpus, page.findings) == ((), (), ())
