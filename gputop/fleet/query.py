"""What ``gputop fleet`` reads from a Prometheus server: each run, its slowest ranks and the alerts at work.

Only Prometheus's HTTP API (``/api/v1/query``, instant queries) over the series
gputop's exporters publish and the job rules record (docs/prometheus.md): no
collector, no rank connects here.  Each failure is one sentence a user can act
on: the server is not there, it is not Prometheus, the job rules are not
loaded, or there is no run (of that id).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

TIMEOUT_S = 10.0
WORST_RANKS = 3  # the job rules' run:gputop_slowest_ranks:top3


class FleetError(Exception):
    """A reason ``gputop fleet`` cannot show the fleet, in one line."""


@dataclass(frozen=True)
class SlowRank:
    rank: str
    hostname: str
    score: float  # the share of each step the others wait for it (gputop:straggler_excess:ratio)


@dataclass(frozen=True)
class FiringAlert:
    name: str
    state: str  # "pending" or "firing"
    severity: str
    cause: str
    rank: str  # "" when the alert is the run's, not a rank's
    hostname: str


@dataclass
class FleetRun:
    run: str
    ranks: int = 0  # ranks with a step time in the last scrape
    step_s: float | None = None  # the run's median step
    steps_per_s: float | None = None
    loader_wait: float | None = None
    exposed_comm: float | None = None  # the rank that waits least
    idle_gpu_hours_per_hour: float | None = None
    slowest: list[SlowRank] = field(default_factory=list)
    alerts: list[FiringAlert] = field(default_factory=list)


class Prometheus:
    """Instant queries against one server's HTTP API."""

    def __init__(self, url: str) -> None:
        parsed = urllib.parse.urlparse(url if "://" in url else f"http://{url}")
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise FleetError(f"{url!r} is not a Prometheus address: give one as http://HOST:9090")
        self.url = f"{parsed.scheme}://{parsed.netloc}{parsed.path.rstrip('/')}"

    def query(self, promql: str) -> list[dict[str, Any]]:
        address = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        try:
            with urllib.request.urlopen(address, timeout=TIMEOUT_S) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as exc:
            raise FleetError(f"{self.url} answered HTTP {exc.code} to a query: is it Prometheus?") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            said = reason.strerror if isinstance(reason, OSError) and reason.strerror else reason
            raise FleetError(f"cannot reach Prometheus at {self.url}: {said}") from None
        except ValueError:
            raise FleetError(f"{self.url} did not answer in JSON: is it Prometheus?") from None
        if not isinstance(answer, dict) or answer.get("status") != "success":
            raise FleetError(
                f"{self.url} refused the query: {answer.get('error') if isinstance(answer, dict) else answer}"
            )
        data = answer.get("data", {})
        return list(data.get("result", [])) if data.get("resultType") == "vector" else []


def read_fleet(prometheus: Prometheus, run: str | None = None) -> list[FleetRun]:
    """Every run the job rules have recorded (or the one asked for), slowest ranks and alerts included."""
    matcher = f'run="{_escape(run)}"' if run else ""
    only = f"{{{matcher}}}" if run else ""
    medians = prometheus.query(f"run:gputop_step_seconds:median{only}")
    if not medians:
        if not prometheus.query("count(gputop_step_time_mean_seconds)"):
            raise FleetError(f"{prometheus.url} has no gputop series: is it scraping gputop's exporters?")
        if not prometheus.query("count(run:gputop_step_seconds:median)"):
            raise FleetError(
                f"{prometheus.url} has gputop's series but not the job rules: load gputop-job-rules.yml "
                "(python -m gputop.export.rules) into its rule_files"
            )
        raise FleetError(f"no run {run!r} in {prometheus.url}: `gputop fleet {prometheus.url}` lists the runs")
    runs = {_run(r): FleetRun(_run(r), step_s=_value(r)) for r in medians}
    for name, attribute in (
        ("run:gputop_steps_per_second", "steps_per_s"),
        ("run:gputop_loader_wait:ratio", "loader_wait"),
        ("run:gputop_exposed_comm:min_ratio", "exposed_comm"),
        ("run:gputop_idle_gpu_hours_per_hour", "idle_gpu_hours_per_hour"),
    ):
        for r in prometheus.query(f"{name}{only}"):
            if (entry := runs.get(_run(r))) is not None:
                setattr(entry, attribute, _value(r))
    for r in prometheus.query(f"count by (run) (gputop_step_time_mean_seconds{only})"):
        if (entry := runs.get(_run(r))) is not None:
            entry.ranks = int(_value(r) or 0)
    for r in prometheus.query(f"run:gputop_slowest_ranks:top{WORST_RANKS}{only}"):
        if (entry := runs.get(_run(r))) is not None and (score := _value(r)) is not None:
            entry.slowest.append(SlowRank(r["metric"].get("rank", ""), r["metric"].get("Hostname", ""), score))
    for r in prometheus.query(f'ALERTS{{alertname=~"Gputop.*"{", " + matcher if run else ""}}}'):
        labels = r["metric"]
        if (entry := runs.get(_run(r))) is not None:
            entry.alerts.append(
                FiringAlert(labels.get("alertname", ""), labels.get("alertstate", ""), labels.get("severity", ""),
                            labels.get("cause", ""), labels.get("rank", ""), labels.get("Hostname", ""))
            )  # fmt: skip
    for entry in runs.values():
        entry.slowest.sort(key=lambda s: -s.score)
        entry.alerts.sort(key=lambda a: (a.state != "firing", a.severity != "critical", a.name, a.rank))
    return sorted(runs.values(), key=lambda e: (not any(a.state == "firing" for a in e.alerts), e.run))


def _run(sample: dict[str, Any]) -> str:
    return str(sample["metric"].get("run", ""))


def _value(sample: dict[str, Any]) -> float | None:
    try:
        return float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
