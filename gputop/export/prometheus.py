"""The Prometheus endpoint: `gputop record --prometheus :9464` and `gputop attach --prometheus`.

A scrape reads a snapshot, computes the figures and the live findings (with
the same persistence and hysteresis as the dashboard's panel) and encodes them;
scrapes closer than ``refresh_s`` share one computation.  Computing on demand
rather than on a timer makes the cost follow the scrape interval: at 1,024
ranks a 2-s timer cost the recorder 30% of a core, one 15-s scrape ~4%
(docs/performance.md).  The findings then advance once per scrape, so one that
must hold 1 s shows from the second scrape that sees it.  prometheus-client
serves the HTTP side on its own daemon thread; it is loaded only here
(``pip install 'gputop-train[prometheus]'``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from gputop.diagnose import Diagnoser
from gputop.diagnose.pipeline import RefreshPipeline
from gputop.export.metrics import Family, families
from gputop.model.snapshot import Snapshot

if TYPE_CHECKING:  # prometheus-client is optional: imported when the exporter starts
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric

REFRESH_S = 2.0  # two scrapers (an HA pair) within this share one computation


class ExporterError(Exception):
    """The endpoint cannot start (library missing, port taken); the message is one line."""


class PrometheusExporter:
    """Serves gputop's metrics on ``host:port``; ``start()`` then ``stop()``."""

    def __init__(self, snapshot: Callable[[], Snapshot], host: str, port: int, *, refresh_s: float = REFRESH_S) -> None:
        self._snapshot = snapshot
        self.host, self.port = host, port
        self.refresh_s = refresh_s
        self.gpu_hostname = socket.gethostname()  # NVML readings are this machine's
        self._families: list[Family] = []
        self._pipeline = RefreshPipeline(diagnoser=Diagnoser())  # used under self._lock
        self._lock = threading.Lock()  # prometheus-client may serve two scrapes at once
        self._refreshed_at = -float("inf")  # monotonic time of the last computation
        self._server: WSGIServer | None = None
        self.last_refresh_s = 0.0  # how long the last refresh took (figures + findings + families)

    def start(self) -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            hint = "pip install 'gputop-train[prometheus]'"
            raise ExporterError(f"--prometheus needs prometheus-client: {hint}") from None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)  # a collector is anything with collect()
        try:
            self._server, _ = start_http_server(self.port, addr=self.host, registry=registry)
        except OSError as exc:
            raise ExporterError(f"cannot serve Prometheus metrics on {self.host}:{self.port}: {exc.strerror}") from None
        if self.port == 0:
            self.port = self._server.server_port

    def stop(self) -> None:
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.shutdown()
                self._server.server_close()

    def refresh(self) -> None:
        started = time.perf_counter()
        update = self._pipeline.update(self._snapshot())
        self._families = families(update.figures, update.findings, gpu_hostname=self.gpu_hostname)
        self.last_refresh_s = time.perf_counter() - started

    def collect(self) -> Iterator[Metric]:
        """Called by prometheus-client on each scrape: refresh if due, then encode the families."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            if time.monotonic() - self._refreshed_at >= self.refresh_s:
                self._refreshed_at = time.monotonic()
                with contextlib.suppress(Exception):  # a failed refresh serves the last families
                    self.refresh()
            current = self._families
        for family in current:
            spec = family.spec
            kind = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            metric = kind(spec.name, spec.help, labels=spec.labels)
            for labels, value in family.samples:
                metric.add_metric(list(labels), value)
            yield metric
