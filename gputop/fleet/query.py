"""What ``gputop fleet`` reads from a Prometheus server: each run, its slowest ranks, the alerts at work, and
how often all that changes.

Only Prometheus's HTTP API (``/api/v1/query``, instant queries, and
``/api/v1/targets`` for the scrape interval) over the series gputop's exporters
publish and the job rules record (docs/prometheus.md): no collector, no rank
connects here.  Each failure is one sentence a user can act on: the server is
not there, it is not Prometheus, the job rules are not loaded, or there is no
run (of that id).
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

TIMEOUT_S = 10.0
WORST_RANKS = 3  # the job rules' run:gputop_slowest_ranks:top3
# When Prometheus does not say how often it scrapes gputop: the interval of Prometheus's example
# configuration and of most installs (its built-in default, 1 m, is rarely left in place).
DEFAULT_INTERVAL_S = 15.0


class FleetError(Exception):
    """A reason ``gputop fleet`` cannot show the fleet, in one line."""


@dataclass(frozen=True)
class SlowRank:
    rank: str
    hostname: str
    score: float  # the share of each step the others wait for it (gputop:straggler_excess:ratio)
    instance: str = ""  # the exporter Prometheus scraped it from (its host:port): where its node's detail is


@dataclass(frozen=True)
class CollectiveWait:
    """A kind of collective on a group of a run: the rank that reaches it last (waits least there), and how much
    longer the typical rank waits in it a step (the job rules' ``gputop:collective_last_to_arrive`` and
    ``run_kind_group:gputop_collective_wait_for_last:seconds``)."""

    kind: str
    group: str
    rank: str
    hostname: str
    wait_s: float


@dataclass(frozen=True)
class FiringAlert:
    name: str
    state: str  # "pending" or "firing"
    severity: str
    cause: str
    rank: str  # "" when the alert is the run's, not a rank's
    hostname: str
    instance: str = ""  # the exporter of the series it fired on; "" when the rule aggregated it away


@dataclass
class FleetRun:
    run: str
    ranks: int = 0  # ranks its exporters export (reporting, finished or lost) in the last scrape
    lost: int = 0  # of those, ranks their exporter lost (silent, or gone without a bye: gputop_rank_up 0)
    finished: int = 0  # ranks that said bye on a normal exit (gputop_rank_ended)
    stopped: int = 0  # ranks ended by a signal (SIGTERM: a cancellation, or a hung job killed): never "finished"
    failed: int = 0  # ranks that said bye on an exception
    step_s: float | None = None  # the run's median step
    steps_per_s: float | None = None
    loader_wait: float | None = None
    exposed_comm: float | None = None  # the rank that waits least
    idle_gpu_hours_per_hour: float | None = None
    mfu: float | None = None  # the median rank's model FLOPs utilization
    slowest: list[SlowRank] = field(default_factory=list)
    alerts: list[FiringAlert] = field(default_factory=list)
    waits: list[CollectiveWait] = field(default_factory=list)  # the longest wait first

    def ended_text(self) -> str:
        """Its ranks that are no longer live, as a count each: "2 finished, 1 failed, 1 lost"; "" when none."""
        counts = (("finished", self.finished), ("stopped", self.stopped), ("failed", self.failed), ("lost", self.lost))
        return ", ".join(f"{n} {word}" for word, n in counts if n)

    def last_in(self, rank: str, hostname: str) -> CollectiveWait | None:
        """The collective this rank reaches last in which the others wait the longest; None: in none."""
        return next((w for w in self.waits if (w.rank, w.hostname) == (rank, hostname)), None)


class Prometheus:
    """Instant queries against one server's HTTP API."""

    def __init__(self, url: str) -> None:
        parsed = urllib.parse.urlparse(url if "://" in url else f"http://{url}")
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise FleetError(f"{url!r} is not a Prometheus address: give one as http://HOST:9090")
        self.url = f"{parsed.scheme}://{parsed.netloc}{parsed.path.rstrip('/')}"

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's samples: each a dict with ``metric`` (the labels) and ``value`` ([time, "text"])."""
        data = self.get("/api/v1/query", {"query": promql})
        return list(data.get("result", [])) if data.get("resultType") == "vector" else []

    def get(self, path: str, params: dict[str, str]) -> dict[str, Any]:
        """The ``data`` of one API answer; a FleetError (one line) when there is none."""
        address = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(address, timeout=TIMEOUT_S) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as exc:
            raise FleetError(f"{self.url} answered HTTP {exc.code} to a query: is it Prometheus?") from None
        except (urllib.error.URLError, OSError) as exc:
            raise FleetError(f"cannot reach Prometheus at {self.url}: {unreachable_reason(exc)}") from None
        except ValueError:
            raise FleetError(f"{self.url} did not answer in JSON: is it Prometheus?") from None
        if not isinstance(answer, dict) or answer.get("status") != "success":
            raise FleetError(
                f"{self.url} refused the query: {answer.get('error') if isinstance(answer, dict) else answer}"
            )
        data = answer.get("data", {})
        return data if isinstance(data, dict) else {}


def unreachable_reason(exc: OSError) -> object:
    """Why a connection failed, as the system says it: "Connection refused", "timed out"."""
    reason = getattr(exc, "reason", exc)
    return reason.strerror if isinstance(reason, OSError) and reason.strerror else reason


def read_fleet(prometheus: Prometheus, run: str | None = None) -> list[FleetRun]:
    """Every run the job rules have recorded (or the one asked for), slowest ranks and alerts included."""
    matcher = f'run="{_escape(run)}"' if run else ""
    only = f"{{{matcher}}}" if run else ""
    # A run is known by its median step or, when none of its ranks stepped in the exporters' span (a hang),
    # by its ranks that report: the run that most needs a look must not drop out of the view.
    # And a run whose ranks all ended (finished, stopped, failed or lost) by the ranks its exporters still export.
    medians = prometheus.query(f"run:gputop_step_seconds:median{only}")
    reporting = prometheus.query(f"run:gputop_ranks_reporting{only}")
    exported = prometheus.query(f"count by (run) (gputop_rank_up{only})")
    if not medians and not reporting:
        _why_no_run_reads(prometheus, run, exported)
    runs = {_run(r): FleetRun(_run(r)) for r in (*reporting, *exported)}
    for r in medians:
        runs.setdefault(_run(r), FleetRun(_run(r))).step_s = _value(r)
    for name, attribute in (
        ("run:gputop_steps_per_second", "steps_per_s"),
        ("run:gputop_loader_wait:ratio", "loader_wait"),
        ("run:gputop_exposed_comm:min_ratio", "exposed_comm"),
        ("run:gputop_idle_gpu_hours_per_hour", "idle_gpu_hours_per_hour"),
        ("run:gputop_mfu:median", "mfu"),
    ):
        for entry, r in _per_run(prometheus, f"{name}{only}", runs):
            setattr(entry, attribute, _value(r))
    for r in exported:
        runs[_run(r)].ranks = int(_value(r) or 0)
    _read_ended(prometheus, only, runs)
    for entry, r in _per_run(prometheus, f"run:gputop_slowest_ranks:top{WORST_RANKS}{only}", runs):
        labels = r["metric"]
        if (score := _value(r)) is not None:
            entry.slowest.append(
                SlowRank(labels.get("rank", ""), labels.get("Hostname", ""), score, labels.get("instance", ""))
            )
    for entry, r in _per_run(prometheus, f'ALERTS{{alertname=~"Gputop.*"{", " + matcher if run else ""}}}', runs):
        labels = r["metric"]
        entry.alerts.append(
            FiringAlert(labels.get("alertname", ""), labels.get("alertstate", ""), labels.get("severity", ""),
                        labels.get("cause", ""), labels.get("rank", ""), labels.get("Hostname", ""),
                        labels.get("instance", ""))
        )  # fmt: skip
    _read_waits(prometheus, only, runs)
    for entry in runs.values():
        entry.slowest.sort(key=lambda s: -s.score)
        entry.alerts.sort(key=lambda a: (a.state != "firing", a.severity != "critical", a.name, a.rank))
    return sorted(runs.values(), key=lambda e: (not any(a.state == "firing" for a in e.alerts), e.run))


def _why_no_run_reads(prometheus: Prometheus, run: str | None, exported: list[dict[str, Any]]) -> None:
    """Raise why no run has a median step nor ranks reporting, unless it is that every run known has ended."""
    if not prometheus.query("count(gputop_rank_up)"):
        raise FleetError(f"{prometheus.url} has no gputop series: is it scraping gputop's exporters?")
    rules_recorded = prometheus.query("count(run:gputop_step_seconds:median) or count(run:gputop_ranks_reporting)")
    if not rules_recorded and prometheus.query("count(gputop_seconds_since_step)"):  # ranks report: rules would say
        raise FleetError(
            f"{prometheus.url} has gputop's series but not the job rules: load gputop-job-rules.yml "
            "(python -m gputop.export.rules) into its rule_files"
        )
    if not exported:
        raise FleetError(f"no run {run!r} in {prometheus.url}: `gputop fleet {prometheus.url}` lists the runs")


def _read_ended(prometheus: Prometheus, only: str, runs: dict[str, FleetRun]) -> None:
    """Each run's ranks that are no longer live: lost (gone without a bye), finished (a normal exit), stopped (a
    signal: a cancellation's SIGTERM, or a hung job's, whose hang its alerts still carry) and failed (an
    exception), from the bye each said."""
    for entry, r in _per_run(prometheus, f"count by (run) (gputop_rank_up{only} == 0)", runs):
        entry.lost = int(_value(r) or 0)
    for entry, r in _per_run(prometheus, f"count by (run, how) (gputop_rank_ended{only})", runs):
        count = int(_value(r) or 0)
        how = r["metric"].get("how")
        if how == "exception":
            entry.failed += count
        elif how == "signal":
            entry.stopped += count
        else:
            entry.finished += count


def _read_waits(prometheus: Prometheus, only: str, runs: dict[str, FleetRun]) -> None:
    """Each run's collectives with a wait for the last to arrive, that rank named, the longest wait first."""
    waits: dict[tuple[str, str, str], float] = {}
    for _, r in _per_run(prometheus, f"run_kind_group:gputop_collective_wait_for_last:seconds{only}", runs):
        labels = r["metric"]
        if (wait := _value(r)) is not None and wait > 0:
            waits[(_run(r), labels.get("kind", ""), labels.get("group", ""))] = wait
    for entry, r in _per_run(prometheus, f"gputop:collective_last_to_arrive{only}", runs):
        labels = r["metric"]
        wait = waits.get((entry.run, labels.get("kind", ""), labels.get("group", "")))
        if wait is not None:
            entry.waits.append(CollectiveWait(labels.get("kind", ""), labels.get("group", ""),
                                              labels.get("rank", ""), labels.get("Hostname", ""), wait))  # fmt: skip
    for entry in runs.values():
        entry.waits.sort(key=lambda w: -w.wait_s)


def _per_run(prometheus: Prometheus, promql: str, runs: dict[str, FleetRun]) -> Iterator[tuple[FleetRun, Any]]:
    """Each sample the query answers, with the run it belongs to; a sample of a run not listed is skipped."""
    for sample in prometheus.query(promql):
        if (entry := runs.get(_run(sample))) is not None:
            yield entry, sample


def _run(sample: dict[str, Any]) -> str:
    return str(sample["metric"].get("run", ""))


def _value(sample: dict[str, Any]) -> float | None:
    """A sample's value; None for none, or for NaN (a rule over no data): shown N/A, never as a number."""
    try:
        value = float(sample["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


@dataclass(frozen=True)
class Scraping:
    """How Prometheus scrapes gputop's exporters: how often (the fleet's figures change no faster), and where."""

    interval_s: float
    said: str  # where the interval comes from, or why it is the default, in words
    known: bool  # read from Prometheus; False: DEFAULT_INTERVAL_S, worth asking again later
    metrics_urls: dict[str, str] = field(default_factory=dict)  # instance -> the URL Prometheus scrapes it at


def read_scraping(prometheus: Prometheus) -> Scraping:
    """The scrape interval of the jobs that carry gputop's series (the smallest), from the active targets.

    Never raises: a server that cannot say gives ``DEFAULT_INTERVAL_S`` with the reason.
    """
    default = f"Prometheus's scrape interval unknown, {DEFAULT_INTERVAL_S:g} s assumed"
    try:
        carrying = prometheus.query("count by (job) (gputop_rank_up)")
        targets = prometheus.get("/api/v1/targets", {"state": "active"}).get("activeTargets", [])
    except FleetError as exc:
        return Scraping(DEFAULT_INTERVAL_S, f"{default}: {exc}", known=False)
    jobs = {str(sample["metric"].get("job", "")) for sample in carrying}
    ours = [t for t in targets if isinstance(t, dict) and t.get("labels", {}).get("job") in jobs]
    urls = {str(t["labels"].get("instance", "")): str(t["scrapeUrl"]) for t in ours if t.get("scrapeUrl")}
    if not jobs:
        return Scraping(DEFAULT_INTERVAL_S, f"{default}: no scrape job carries gputop's series yet", known=False)
    intervals = [
        (seconds, str(t["labels"]["job"])) for t in ours if (seconds := parse_duration(t.get("scrapeInterval")))
    ]
    if not intervals:
        said = f"{default}: its targets API does not give one (an older Prometheus)"
        return Scraping(DEFAULT_INTERVAL_S, said, known=False, metrics_urls=urls)
    seconds, job = min(intervals)
    return Scraping(seconds, f"the scrape interval of job {job!r}", known=True, metrics_urls=urls)


_DURATION_UNITS_S = {"y": 365 * 86400.0, "w": 7 * 86400.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3}
_DURATION_PART = re.compile(r"(\d+)(ms|y|w|d|h|m|s)")


def parse_duration(text: object) -> float | None:
    """Seconds in a Prometheus duration ("15s", "1m30s", "500ms"); None for anything else, or zero."""
    if not isinstance(text, str) or not text:
        return None
    parts = _DURATION_PART.findall(text)
    if "".join(number + unit for number, unit in parts) != text:
        return None
    seconds = sum(int(number) * _DURATION_UNITS_S[unit] for number, unit in parts)
    return seconds or None


# Why a run's figure is N/A: which of the job rules' series had no sample for it, and what would give it one.
MISSING = {
    "step_s": "median step: run:gputop_step_seconds:median has no sample for it",
    "steps_per_s": "steps/s: no rank of the run exports gputop_steps_per_second (no step in the exporter's span)",
    "loader_wait": "loader: no rank of the run reports loader wait (iterate the loader with gputop.track(loader))",
    "exposed_comm": "comm: no rank of the run reports exposed communication (DDP's logger or the model's hooks "
    "have not timed a step: gputop.watch(model))",
    "mfu": "MFU: no rank of the run exports gputop_mfu_ratio (its model's FLOPs not counted yet, or its device's "
    "peak not known: docs/mfu.md)",
    "idle_gpu_hours_per_hour": "idle GPU-h/h: no GPU is joined to the run's ranks (a CPU run, or its nodes' GPUs "
    "not exported: gputop_gpu_rank_info)",
}


# A run whose ranks report but took no step in their exporters' span has no per-step figure at all.
STOPPED = "no rank of the run took a step in its exporters' last 10 s (a hang or a long stop: see its alerts)"
PER_STEP = ("step_s", "loader_wait", "exposed_comm")


ENDED = "every rank of the run has ended (finished, stopped, failed or lost): none steps any more"


def ended(run: FleetRun) -> bool:
    """No rank of the run reports any more: each said bye or was lost."""
    return 0 < run.ranks <= run.finished + run.stopped + run.failed + run.lost


def stopped(run: FleetRun) -> bool:
    """The run's ranks report, and none of them stepped lately."""
    return run.step_s is None and run.steps_per_s == 0


def missing_reasons(run: FleetRun) -> dict[str, str]:
    """Why each of the run's figures Prometheus had no value for is N/A, by attribute name."""
    return {
        name: f"{why.split(':')[0]}: {ENDED if ended(run) else STOPPED}"
        if (stopped(run) or ended(run)) and name in PER_STEP
        else why
        for name, why in MISSING.items()
        if getattr(run, name) is None
    }
