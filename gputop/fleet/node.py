"""One node's live detail for ``gputop fleet``: its exporter's own ``/metrics`` page, read directly.

Prometheus gives the fleet at its scrape interval; a node's exporter (``gputop
agent --prometheus``, ``gputop record --prometheus``) answers at once, with
every rank it exports, the GPUs it reads and the findings of its own diagnosis.
The page is parsed with prometheus-client's text parser into plain frozen
dataclasses; a figure the exporter left out (not measured) stays None, never
zero.  A failure is one line: the exporter is not there, or it is no exporter.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gputop.fleet.query import FleetError, unreachable_reason

TIMEOUT_S = 5.0  # the page is read every 2 s: an exporter slower than this is as good as gone

# gputop's metric names (gputop/export/metrics.py, which this package may not import: it brings the model)
# and the attribute each fills; tests/unit/test_fleet_node.py checks that gputop exports each.
RANK_FIGURES = {
    "gputop_rank_up": "up",
    "gputop_step_time_mean_seconds": "step_s",
    "gputop_steps_per_second": "steps_per_s",
    "gputop_loader_wait_ratio": "loader_wait",
    "gputop_exposed_comm_ratio": "exposed_comm",
    "gputop_seconds_since_step": "seconds_since_step",
}
GPU_FIGURES = {
    "gputop_gpu_utilization_ratio": "utilization",
    "gputop_gpu_memory_used_bytes": "memory_used_bytes",
    "gputop_gpu_memory_total_bytes": "memory_total_bytes",
    "gputop_gpu_power_watts": "power_w",
    "gputop_gpu_temperature_celsius": "temperature_c",
}
GPU_RANKS = "gputop_gpu_rank_info"
FINDING = "gputop_finding"


@dataclass(frozen=True)
class NodeRank:
    """One rank the exporter exports, with the figures it measured (None: not measured)."""

    run: str
    rank: str
    hostname: str
    uuid: str  # its GPU's, "" on a CPU rank
    up: float | None = None  # 1 while it reports, 0 once lost
    step_s: float | None = None  # mean step over the exporter's span
    steps_per_s: float | None = None
    loader_wait: float | None = None
    exposed_comm: float | None = None
    seconds_since_step: float | None = None  # the hang clock; None once finished or lost


@dataclass(frozen=True)
class NodeGpu:
    """One GPU the exporter reads (NVML), and the ranks joined to it by UUID."""

    gpu: str  # its NVML index
    uuid: str
    model: str
    hostname: str
    utilization: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    ranks: tuple[tuple[str, str], ...] = ()  # (run, rank)


@dataclass(frozen=True)
class NodeFinding:
    """A diagnosis the node's own gputop has at work (``gputop_finding``)."""

    cause: str
    severity: str
    run: str
    hostname: str
    rank: str  # "" when it names several
    gpu: str


@dataclass(frozen=True)
class NodePage:
    """What one exporter said in one read."""

    url: str
    ranks: tuple[NodeRank, ...]
    gpus: tuple[NodeGpu, ...]
    findings: tuple[NodeFinding, ...]


def metrics_url(instance: str, known: Mapping[str, str] | None = None) -> str:
    """Where an instance's page is: the URL Prometheus scrapes it at when known, else ``http://INSTANCE/metrics``."""
    if known and instance in known:
        return known[instance]
    return instance if "://" in instance else f"http://{instance}/metrics"


def read_node(url: str, *, timeout_s: float = TIMEOUT_S) -> NodePage:
    """Read and parse one exporter's page; a FleetError (one line) when that cannot be done."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            text = response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        raise FleetError(f"{url} answered HTTP {exc.code}: is it gputop's exporter (--prometheus)?") from None
    except (urllib.error.URLError, OSError) as exc:
        raise FleetError(f"cannot reach the exporter at {url}: {unreachable_reason(exc)}") from None
    return parse_node_page(url, text)


def parse_node_page(url: str, text: str) -> NodePage:
    """The ranks, GPUs and findings on one page of Prometheus's text format; other metrics are passed over."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        raise FleetError("a node's detail needs prometheus-client: pip install 'gputop-train[prometheus]'") from None
    try:
        samples = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]
    except ValueError:
        raise FleetError(f"{url} is not a Prometheus metrics page: is it gputop's exporter (--prometheus)?") from None
    return NodePage(url, _ranks(samples), _gpus(samples), _findings(samples))


Sample = tuple[str, dict[str, str], float]


def _ranks(samples: Iterable[Sample]) -> tuple[NodeRank, ...]:
    figures: dict[tuple[str, str], dict[str, float]] = {}
    named: dict[tuple[str, str], NodeRank] = {}
    for name, labels, value in samples:
        if (attribute := RANK_FIGURES.get(name)) is None:
            continue
        key = (labels.get("run", ""), labels.get("rank", ""))
        named.setdefault(key, NodeRank(key[0], key[1], labels.get("Hostname", ""), labels.get("UUID", "")))
        figures.setdefault(key, {})[attribute] = value
    ranks = [NodeRank(**{**vars(named[key]), **figures[key]}) for key in named]
    return tuple(sorted(ranks, key=lambda r: (r.run, _number(r.rank), r.rank)))


def _gpus(samples: Iterable[Sample]) -> tuple[NodeGpu, ...]:
    figures: dict[tuple[str, str, str], dict[str, float]] = {}
    named: dict[tuple[str, str, str], NodeGpu] = {}
    ranks: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
    for name, labels, value in samples:
        attribute = GPU_FIGURES.get(name)
        if attribute is None and name != GPU_RANKS:
            continue
        key = (labels.get("Hostname", ""), labels.get("gpu", ""), labels.get("UUID", ""))
        named.setdefault(key, NodeGpu(key[1], key[2], labels.get("modelName", ""), key[0]))
        if attribute is not None:
            figures.setdefault(key, {})[attribute] = value
        else:
            ranks.setdefault(key, []).append((labels.get("run", ""), labels.get("rank", "")))
    gpus = [
        NodeGpu(**{**vars(named[key]), **figures.get(key, {}), "ranks": tuple(sorted(ranks.get(key, [])))})
        for key in named
    ]
    return tuple(sorted(gpus, key=lambda g: (g.hostname, _number(g.gpu), g.uuid)))


def _findings(samples: Iterable[Sample]) -> tuple[NodeFinding, ...]:
    found = {
        NodeFinding(*(labels.get(label, "") for label in ("cause", "severity", "run", "Hostname", "rank", "gpu")))
        for name, labels, value in samples
        if name == FINDING and value > 0
    }
    severity_order = {"critical": 0, "warn": 1, "info": 2}
    return tuple(sorted(found, key=lambda f: (severity_order.get(f.severity, 3), f.run, f.cause, f.rank)))


def _number(text: str) -> int:
    """A rank or GPU index's number, for sorting 2 before 10; labels that are no number sort last."""
    return int(text) if text.isdigit() else 1 << 30
