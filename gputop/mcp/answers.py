"""What the MCP tools answer: the live chain's figures and findings as JSON-able data, and the capture budget.

Pure, like the report it borrows its rank rows from: a ``Refresh`` (the
figures over the dashboard's span and the findings as the dashboard shows
them) comes in, plain dicts go out.  A finding is ``Finding.to_dict``, the
same the report and the alert payload carry, so an agent reads the evidence,
the frames, the cost and the fix a person reads.  An argument that names
nothing (an unknown run, a rank the run does not have) raises ``BadArgument``
with a sentence that says what there is; the server answers it as the tool's
error, never as a crash.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gputop.diagnose.findings import SEVERITIES, Finding
from gputop.diagnose.pipeline import Refresh
from gputop.model.captures import compare
from gputop.model.figures import Figures, RankFigures, RunFigures, rank_series
from gputop.model.snapshot import LIVE, RankSnapshot
from gputop.protocol import CaptureResult
from gputop.report import rank_entry

# A capture asked by an agent: few steps, since the training thread pays for each profiled one, and at most
# one per run in CAPTURE_EVERY_S, so an agent in a loop cannot keep a run under the profiler.
MAX_CAPTURE_STEPS = 20
CAPTURE_EVERY_S = 300.0
MAX_CAPTURE_WAIT_S = 300.0

HISTORY_WINDOWS = 60  # a rank's history by default: its newest windows (1 s each from a default reporter)


class BadArgument(ValueError):
    """An argument that names nothing there is: the message says what there is instead."""


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _runs_seen(figures: Figures) -> str:
    return ", ".join(repr(run.run_id) for run in figures.runs) or "none"


def run_of(figures: Figures, run_id: str) -> RunFigures:
    """The run named ``run_id``; BadArgument naming the runs there are when there is none."""
    for run in figures.runs:
        if run.run_id == run_id:
            return run
    raise BadArgument(f"no run {run_id!r} reports to this collector; runs seen: {_runs_seen(figures)}")


def rank_of(figures: Figures, run_id: str | None, rank: int) -> RankFigures:
    """Rank ``rank`` of ``run_id`` (None or "": the newest run that has that rank)."""
    runs = [run_of(figures, run_id)] if run_id else list(figures.runs)
    having = [r for run in runs for r in run.ranks if r.rank == rank]
    if having:
        return max(having, key=lambda r: r.snapshot.last_seen_t)
    if run_id:
        ranks = ", ".join(str(r.rank) for r in runs[0].ranks) or "none yet"
        raise BadArgument(f"run {run_id!r} has no rank {rank}; its ranks: {ranks}")
    raise BadArgument(f"no run has a rank {rank}; runs seen: {_runs_seen(figures)}")


def _severities(findings: Sequence[Finding]) -> dict[str, int]:
    counted = Counter(f.severity for f in findings)
    return {severity: counted.get(severity, 0) for severity in reversed(SEVERITIES)}


def nothing_reports(update: Refresh) -> str | None:
    """What to do when no run reports yet; None when some do."""
    if update.figures.runs:
        return None
    where = update.figures.snapshot.listen or "this collector"
    return (
        f"no run reports to {where} yet: start the training job with the same address "
        "(GPUTOP_PORT=PORT, GPUTOP_SOCKET=PATH or GPUTOP_ADDR=HOST:PORT) and gputop.watch(model) in it"
    )


def runs(update: Refresh) -> dict[str, Any]:
    """Every run the collector sees: its ranks, how they step, and how many findings of each severity."""
    out = []
    for run in update.figures.runs:
        found = [f for f in update.findings if f.run_id == run.run_id]
        out.append(
            {
                "run_id": run.run_id,
                "name": run.snapshot.name,
                "world_size": run.world_size,
                "ranks_reporting": run.snapshot.live_ranks,
                "seen_for_s": round(max(update.figures.t - run.snapshot.first_seen_t, 0.0), 1),
                "findings": _severities(found),
                "worst_finding": found[0].title if found else None,
                "ranks": [
                    {
                        "rank": r.rank,
                        "status": r.status,
                        "status_reason": r.snapshot.status_reason,
                        "host": r.hello.hostname,
                        "pid": r.hello.pid,
                        "device": r.hello.device,
                        "steps": r.stats.steps,
                        "step_time_p50_ms": _round(None if r.stats.step.p50_s is None else r.stats.step.p50_s * 1e3),
                        "samples_per_s": _round(r.stats.step.samples_per_s, 1),
                    }
                    for r in run.ranks
                ],
            }
        )
    answer: dict[str, Any] = {"span_s": update.figures.span_s, "diagnosis": update.diagnosis, "runs": out}
    if (hint := nothing_reports(update)) is not None:
        answer["hint"] = hint
    return answer


def findings(update: Refresh, run_id: str | None = None, price_per_hour: float | None = None) -> dict[str, Any]:
    """The findings shown now, worst first, of one run (``run_id``) or of every run."""
    if run_id:
        run_of(update.figures, run_id)
    shown = [f for f in update.findings if not run_id or f.run_id == run_id]
    answer: dict[str, Any] = {
        "run_id": run_id or None,
        "span_s": update.figures.span_s,
        "diagnosis": update.diagnosis,  # "ok"; "failed: ..." when a rule raised (no findings then)
        "findings": [f.to_dict(price_per_hour) for f in shown],
    }
    if (hint := nothing_reports(update)) is not None:
        answer["hint"] = hint
    elif not shown:
        answer["hint"] = "nothing crossed a diagnosis threshold over the span (findings show once they held 1 s)"
    return answer


def rank(
    update: Refresh,
    figures: RankFigures,
    *,
    history: RankSnapshot | None = None,
    points: int = HISTORY_WINDOWS,
    price_per_hour: float | None = None,
) -> dict[str, Any]:
    """One rank's figures over the span (the report's row), its findings, and its newest ``points`` windows.

    ``figures``: the rank in ``update`` (``rank_of``).  ``history``: the same rank
    with more windows than the span's (the source's focused rank); without it the
    span's windows make the history.
    """
    view = history if history is not None and history.key == figures.key else figures.snapshot
    gpu_history = update.figures.snapshot.gpu_history_of(view.hello.hostname)
    series = rank_series(view, gpu_history, points)
    windows = view.windows[-points:]
    now = update.figures.t
    gpu = figures.gpu
    return {
        "run_id": figures.run_id,
        "span_s": update.figures.span_s,
        "figures": rank_entry(figures),
        "gpu": None
        if gpu is None
        else {
            "index": gpu.index,
            "name": gpu.name,
            "uuid": gpu.uuid,
            "util_pct_span_mean": _round(figures.gpu_util_pct, 1),
            "mem_used_bytes": gpu.mem_used_bytes,
            "mem_total_bytes": gpu.mem_total_bytes,
        },
        "findings": [
            f.to_dict(price_per_hour) for f in update.findings if f.run_id == figures.run_id and figures.rank in f.ranks
        ],
        "history": {
            "windows": [
                {
                    "ago_s": round(now - w.t1, 1),
                    "steps": w.steps,
                    "step_ms": _round(None if step is None else step * 1e3),
                    "loader_wait_pct": _round(None if loader is None else loader * 100),
                    "exposed_comm_pct": _round(None if exposed is None else exposed * 100),
                }
                for w, step, loader, exposed in zip(
                    windows, series.step_s, series.loader_wait_frac, series.exposed_comm_frac, strict=True
                )
            ],
            "gpu_util_pct": [_round(u, 1) for u in series.gpu_util_pct],  # one a GPU sample (1 s), oldest first
        },
        "captures": [capture_entry(c) for c in view.captures[-3:]],
    }


def capture_entry(result: CaptureResult) -> dict[str, Any]:
    """A capture's result as JSON: its steps, trace file and busiest operators, or why there is none."""
    return msgspec.to_builtins(result)  # type: ignore[no-any-return]


def capture(results: Sequence[CaptureResult]) -> dict[str, Any]:
    """Several ranks' captures: each result, and their busiest operators side by side (ms per step)."""
    header, rows = compare(results)
    return {
        "results": [capture_entry(r) for r in results],
        "side_by_side": {"header": header, "rows": rows},
    }


def capturable(update: Refresh, run_id: str | None, ranks: Sequence[int], steps: int) -> RunFigures:
    """The run to capture ``ranks`` of, checked: each rank reports now, and the steps are few."""
    if not ranks:
        raise BadArgument("name at least one rank to profile")
    if not 1 <= steps <= MAX_CAPTURE_STEPS:
        raise BadArgument(f"steps must be from 1 to {MAX_CAPTURE_STEPS}: the training thread pays for each")
    first = rank_of(update.figures, run_id, ranks[0])
    run = run_of(update.figures, first.run_id)
    for number in ranks:
        found = rank_of(update.figures, run.run_id, number)
        if found.status != LIVE:
            raise BadArgument(f"rank {number} of run {run.run_id!r} is {found.status}, so it cannot profile")
    return run


@dataclass
class CaptureBudget:
    """At most one capture per run every ``every_s``: what stops an agent keeping a run under the profiler.

    Pure: the caller passes the time (a monotonic clock).  Not thread-safe on its own; the server holds a lock.
    """

    every_s: float = CAPTURE_EVERY_S
    _last: dict[str, float] = field(default_factory=dict)

    def take(self, run_id: str, now: float) -> None:
        """Spend this run's capture; BadArgument saying when the next may be asked when it is spent."""
        last = self._last.get(run_id)
        if last is not None and now - last < self.every_s:
            raise BadArgument(
                f"run {run_id!r} was profiled {now - last:.0f} s ago; gputop profiles a run at most once every "
                f"{self.every_s:.0f} s so that training is not kept under the profiler: ask again in "
                f"{self.every_s - (now - last):.0f} s (its result is in get_rank's captures meanwhile)"
            )
        self._last[run_id] = now

    def next_in_s(self, run_id: str, now: float) -> float:
        """Seconds until the run may be profiled again (0: now)."""
        last = self._last.get(run_id)
        return 0.0 if last is None else max(self.every_s - (now - last), 0.0)
