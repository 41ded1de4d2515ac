"""A Prometheus server's HTTP API for the fleet's fast tests: real HTTP, real-shaped answers, no Prometheus binary.

An instant query answers the samples a test set for that exact PromQL, and any
other query an empty vector, as Prometheus answers a query over series it does
not have.  ``/api/v1/targets`` answers the active targets set, in the shape
Prometheus 2.42 gives them (taken from a real one).  ``stop()`` makes it
unreachable; ``start()`` again serves on the same port, as a restarted server
would.  The tests/integration tier runs the real ``prometheus`` instead.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import math
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

from gputop.export.prometheus import PrometheusExporter
from tests.support import tui_fixtures as fx

JSON = dict[str, Any]


def sample(value: float, **labels: str) -> JSON:
    """One sample of an instant vector (a selector's carries the series' name as ``__name__``; an aggregate's not)."""
    text = "NaN" if math.isnan(value) else repr(float(value))  # as Prometheus spells it
    return {"metric": labels, "value": [time.time(), text]}


def target(job: str, instance: str, *, interval: str | None = "15s", scheme: str = "http") -> JSON:
    """One active target as ``/api/v1/targets`` lists it; ``interval=None``: an older Prometheus that omits it."""
    answer: JSON = {
        "discoveredLabels": {"__address__": instance, "__metrics_path__": "/metrics", "__scheme__": scheme, "job": job},
        "labels": {"instance": instance, "job": job},
        "scrapePool": job,
        "scrapeUrl": f"{scheme}://{instance}/metrics",
        "globalUrl": f"{scheme}://{instance}/metrics",
        "lastError": "",
        "lastScrape": "2026-11-28T17:34:08.359131239Z",
        "lastScrapeDuration": 0.0016,
        "health": "up",
    }
    if interval is not None:
        answer |= {"scrapeInterval": interval, "scrapeTimeout": "10s"}
    return answer


class PrometheusAPI:
    """Serves ``answers`` (PromQL -> samples) and ``targets`` on a loopback port until ``stop()``."""

    def __init__(self) -> None:
        self.answers: dict[str, list[JSON]] = {}
        self.targets: list[JSON] = []
        self.port = 0
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> PrometheusAPI:
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                address = urllib.parse.urlparse(self.path)
                params = urllib.parse.parse_qs(address.query)
                if address.path == "/api/v1/query":
                    result = api.answers.get(params.get("query", [""])[0], [])
                    api._send(self, {"resultType": "vector", "result": result})
                elif address.path == "/api/v1/targets":
                    api._send(self, {"activeTargets": api.targets, "droppedTargets": []})
                else:
                    self.send_error(404)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    @staticmethod
    def _send(handler: http.server.BaseHTTPRequestHandler, data: JSON) -> None:
        body = json.dumps({"status": "success", "data": data}).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def rank_labels(run: str, rank: int, instance: str, hostname: str = "node-a") -> dict[str, str]:
    """The labels of one of gputop's per-rank series once Prometheus scraped it (job ``gputop``)."""
    return {"run": run, "rank": str(rank), "Hostname": hostname, "UUID": f"GPU-{rank:08d}-aaaa-bbbb-cccc-000000000000",
            "namespace": "", "pod": "", "slurm_job": "", "instance": instance, "job": "gputop"}  # fmt: skip


def record_two_rank_run(api: PrometheusAPI, exporter: str, *, run: str = "run-a", interval: str = "15s") -> None:
    """What the job rules record of a 2-rank run exported by ``exporter`` (host:port), as its Prometheus answers;
    beside the runs recorded before.

    Rank 1 waits for data: the others wait for it 21% of each step, the run's loader alert fires and the
    straggler alert is pending.  No rank reports exposed communication, so the run's comm has no series.
    """
    ranks = [rank_labels(run, rank, exporter) for rank in (0, 1)]
    loader_alert = {"alertname": "GputopJobLoaderBoundCritical", "alertstate": "firing", "severity": "critical",
                    "cause": "data_loading", "run": run}  # fmt: skip
    straggler_alert = {"alertname": "GputopJobStraggler", "alertstate": "pending", "severity": "warning",
                       "cause": "straggler", **ranks[1]}  # fmt: skip
    # A selector's samples carry the series' name, as Prometheus answers them; an aggregation's do not.
    selected: dict[str, list[tuple[dict[str, str], float]]] = {
        "run:gputop_step_seconds:median": [({"run": run}, 0.05)],
        "run:gputop_ranks_reporting": [({"run": run}, 2.0)],
        "run:gputop_steps_per_second": [({"run": run}, 20.0)],
        "run:gputop_loader_wait:ratio": [({"run": run}, 0.23)],
        "run:gputop_idle_gpu_hours_per_hour": [({"run": run}, 0.3)],
        "run:gputop_mfu:median": [({"run": run}, 0.41)],
        "run:gputop_slowest_ranks:top3": [(ranks[1], 0.21), (ranks[0], -0.02)],
        'ALERTS{alertname=~"Gputop.*"}': [(loader_alert, 1.0), (straggler_alert, 1.0)],
    }
    for promql, series in selected.items():
        name = promql.split("{")[0]
        api.answers.setdefault(promql, []).extend(sample(value, __name__=name, **labels) for labels, value in series)
    api.answers.setdefault("count by (run) (gputop_rank_up)", []).append(sample(2, run=run))
    api.answers["count by (job) (gputop_rank_up)"] = [sample(2, job="gputop")]
    api.targets = [target("gputop", exporter, interval=interval)]


@contextlib.contextmanager
def exporting_two_ranks() -> Iterator[str]:
    """gputop's own exporter over a 2-rank run on node-a (rank 1 waits for data); its instance (host:port)."""
    snapshot = fx.two_ranks()
    exporter = PrometheusExporter(lambda: snapshot, "127.0.0.1", 0)
    exporter.start()
    try:
        yield f"127.0.0.1:{exporter.port}"
    finally:
        exporter.stop()
