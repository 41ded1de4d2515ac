"""The Prometheus endpoint: `gputop record --prometheus :9464` and `gputop attach --prometheus`.

A refresh thread reads a snapshot every ``refresh_s``, computes the figures
and the live findings (with the same persistence as the dashboard's panel)
and keeps the resulting families; a scrape only encodes the latest ones, so a
scrape costs no diagnosis and a slow scraper never holds the store's lock.
prometheus-client serves the HTTP side on its own daemon thread; it is loaded
only here (``pip install 'gputop[prometheus]'``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from gputop.diagnose import Diagnoser
from gputop.export.metrics import Family, families
from gputop.model.figures import summarize
from gputop.model.snapshot import Snapshot

REFRESH_S = 2.0  # Prometheus scrapes every 15-60 s; findings persist over seconds


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
        self._diagnoser = Diagnoser()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gputop-prometheus", daemon=True)
        self._server: Any = None
        self.last_refresh_s = 0.0  # how long the last refresh took (figures + findings + families)

    def start(self) -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise ExporterError("--prometheus needs prometheus-client: pip install 'gputop[prometheus]'") from None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)  # type: ignore[arg-type]  # a collector is anything with collect()
        self.refresh()
        try:
            self._server, _ = start_http_server(self.port, addr=self.host, registry=registry)
        except OSError as exc:
            raise ExporterError(f"cannot serve Prometheus metrics on {self.host}:{self.port}: {exc.strerror}") from None
        if self.port == 0:
            self.port = self._server.server_port
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            with contextlib.suppress(Exception):
                self._server.shutdown()
                self._server.server_close()
        if self._thread.is_alive():
            self._thread.join(self.refresh_s + 1)

    def refresh(self) -> None:
        started = time.perf_counter()
        snapshot = self._snapshot()
        figures = summarize(snapshot)
        findings = self._diagnoser.update(figures)
        self._families = families(figures, findings, gpu_hostname=self.gpu_hostname)
        self.last_refresh_s = time.perf_counter() - started

    def _run(self) -> None:
        while not self._stop.wait(self.refresh_s):
            with contextlib.suppress(Exception):  # a bad refresh keeps the last families; the next one retries
                self.refresh()

    def collect(self) -> Iterator[Any]:
        """Called by prometheus-client on each scrape: encode the latest families, nothing more."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for family in self._families:
            spec = family.spec
            kind = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
            metric = kind(spec.name, spec.help, labels=spec.labels)
            for labels, value in family.samples:
                metric.add_metric(list(labels), value)
            yield metric
