"""What the dashboard shows, computed from one snapshot off the UI thread.

``build_view`` turns a ``Snapshot`` (and the diagnosis's findings) into an
immutable ``DashboardView``: per-rank rows with their stats and the reasons
for every N/A, per-GPU rows with the ranks joined to them, per-run summaries.
It is pure and knows nothing of Textual, so the worker thread can run it and
tests can check it directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import median

from gputop.collect.join import join_ranks_to_gpus
from gputop.collect.samples import GpuProcess, GpuReading, GpuSample
from gputop.collect.store import LIVE, RankView, RunView, Snapshot
from gputop.diagnose.findings import Finding
from gputop.protocol import Window
from gputop.stats import RankStats, rank_stats, recent

STATS_SPAN_S = 10.0  # the table shows the last 10 s: long enough to smooth, short enough to follow a change
HISTORY_POINTS = 240  # newest windows/samples kept for the sparklines (2 min of 0.5 s windows)
# A rank is marked slowest only when its own busy time is this far above its run's
# median; below that, two equal ranks would swap the marker on every refresh.
SLOWEST_MARGIN = 1.05


@dataclass(frozen=True)
class RankRow:
    """One rank as a table row: identity, stats over the last STATS_SPAN_S, and N/A reasons."""

    key: str  # "run_id:rank", the table's row key
    run_id: str
    run_name: str
    rank: int
    host: str
    gpu: str  # NVML index "3"; "(3)" CUDA index on another host; "cpu"; "-" not reported
    stats: RankStats
    status: str
    status_reason: str
    na: dict[str, str] = field(default_factory=dict)  # column -> why it is N/A
    busy_s: float | None = None  # own time per step: step time minus exposed comm
    slowest: bool = False


@dataclass(frozen=True)
class GpuRow:
    """One GPU with the ranks found on it and the processes on it that do not report."""

    reading: GpuReading
    ranks: tuple[str, ...]  # "r0", or "run:r0" when several runs share the machine
    unobserved: tuple[GpuProcess, ...]


@dataclass(frozen=True)
class RunSummary:
    """A run for the header."""

    run_id: str
    name: str
    world_size: int
    live: int
    reporting: int
    uptime_s: float
    steps_per_s: float | None


@dataclass(frozen=True, eq=False)
class DashboardView:
    """Everything the main screen shows at one moment (compared by identity)."""

    snapshot: Snapshot
    runs: tuple[RunSummary, ...]
    rank_rows: tuple[RankRow, ...]
    gpu_rows: tuple[GpuRow, ...]
    gpu_unavailable: str | None  # why there is no GPU data; None when there is (or none yet)
    findings: tuple[Finding, ...]
    diagnosis: str  # "off" (no rules), "ok", or "failed: <reason>"

    @property
    def empty(self) -> bool:
        """Nothing reports yet."""
        return not self.snapshot.runs

    def rank(self, key: str) -> RankView | None:
        """The full RankView behind a row key."""
        for run in self.snapshot.runs:
            for rank in run.ranks:
                if f"{run.run_id}:{rank.rank}" == key:
                    return rank
        return None

    def row(self, key: str) -> RankRow | None:
        for row in self.rank_rows:
            if row.key == key:
                return row
        return None


def row_key(rank: RankView) -> str:
    return f"{rank.run_id}:{rank.rank}"


def na_reasons(rank: RankView, stats: RankStats) -> dict[str, str]:
    """Why each N/A column of a rank is N/A, in words a user can act on."""
    hello = rank.hello
    on_cpu = (hello.device or "").startswith("cpu")
    reasons: dict[str, str] = {}
    if stats.step_time_p50_s is None:
        reasons["step"] = f"step time: no optimizer step in the last {STATS_SPAN_S:.0f} s"
    if stats.loader_wait_frac is None:
        reasons["loader"] = "loader wait: loader not tracked (iterate it with gputop.track(loader))"
    if stats.samples_per_s is None:
        reasons["samples"] = "samples/s: batch size unknown (gputop.track(loader) reports it)"
    if stats.forward_s is None:
        if hello.ddp is False:
            why = "not a DDP model"
        elif hello.ddp is None:
            why = "model not watched yet (gputop.watch(model))"
        else:
            why = "DDP has not logged a sampled iteration yet"
        reasons["ddp"] = f"DDP stats unavailable: {why}"
    if stats.mem_allocated_bytes is None:
        reasons["mem"] = "memory: CPU run (only CUDA memory is measured)" if on_cpu else "memory: not reported"
    if stats.cpu_pct is None:
        reasons["cpu"] = "CPU%: not reported by the rank's reporter"
    if hello.device_uuid is None:
        reasons["gpu"] = "GPU: CPU run" if on_cpu else "GPU: the rank did not report a device UUID"
    return reasons


def _busy_s(stats: RankStats) -> float | None:
    step = stats.step_time_mean_s if stats.step_time_mean_s is not None else stats.step_time_p50_s
    if step is None:
        return None
    return max(step - (stats.exposed_comm_s or 0.0), 0.0)


def _rank_rows(run: RunView, gpu_index: dict[tuple[str, int], int]) -> list[RankRow]:
    rows = []
    for rank in run.ranks:
        stats = rank_stats(recent(rank.windows, STATS_SPAN_S))
        hello = rank.hello
        device = hello.device or ""
        if (rank.run_id, rank.rank) in gpu_index:
            gpu = str(gpu_index[(rank.run_id, rank.rank)])
        elif device.startswith("cpu"):
            gpu = "cpu"
        elif device.startswith("cuda:"):
            gpu = f"({device[5:]})"  # a GPU this machine cannot see: the CUDA index on the rank's own host
        else:
            gpu = "-"
        rows.append(
            RankRow(
                key=row_key(rank),
                run_id=run.run_id,
                run_name=run.name or run.run_id,
                rank=rank.rank,
                host=hello.hostname,
                gpu=gpu,
                stats=stats,
                status=rank.status,
                status_reason=rank.status_reason,
                na=na_reasons(rank, stats),
                busy_s=_busy_s(stats),
            )
        )
    live_busy = [r.busy_s for r in rows if r.status == LIVE and r.busy_s is not None]
    if len(live_busy) >= 2:
        typical = median(live_busy)
        slowest = max((r for r in rows if r.status == LIVE and r.busy_s is not None), key=lambda r: r.busy_s or 0.0)
        if slowest.busy_s is not None and slowest.busy_s > typical * SLOWEST_MARGIN:
            rows = [RankRow(**{**vars(r), "slowest": True}) if r is slowest else r for r in rows]
    return rows


def _run_summary(run: RunView, rows: Sequence[RankRow], t: float) -> RunSummary:
    rates = [r.stats.steps_per_s for r in rows if r.status == LIVE and r.stats.steps_per_s is not None]
    return RunSummary(
        run_id=run.run_id,
        name=run.name or run.run_id,
        world_size=run.world_size,
        live=run.live_ranks,
        reporting=len(run.ranks),
        uptime_s=t - run.first_seen_t,
        steps_per_s=median(rates) if rates else None,
    )


def build_view(snapshot: Snapshot, findings: Sequence[Finding] = (), diagnosis: str = "off") -> DashboardView:
    """The whole main screen's content for one snapshot."""
    joined = join_ranks_to_gpus(snapshot)
    gpu_index = {(r.run_id, r.rank): a.gpu.index for a in joined for r in a.ranks}
    several_runs = len(snapshot.runs) > 1
    names = {run.run_id: (run.name or run.run_id) for run in snapshot.runs}
    gpu_rows = tuple(
        GpuRow(
            reading=a.gpu,
            ranks=tuple((f"{names[r.run_id]}:" if several_runs else "") + f"r{r.rank}" for r in a.ranks),
            unobserved=a.unobserved,
        )
        for a in joined
    )
    rank_rows: list[RankRow] = []
    runs = []
    for run in snapshot.runs:
        rows = _rank_rows(run, gpu_index)
        rank_rows.extend(rows)
        runs.append(_run_summary(run, rows, snapshot.t))
    sample: GpuSample | None = snapshot.gpu
    return DashboardView(
        snapshot=snapshot,
        runs=tuple(runs),
        rank_rows=tuple(rank_rows),
        gpu_rows=gpu_rows,
        gpu_unavailable=sample.unavailable if sample is not None else None,
        findings=tuple(findings),
        diagnosis=diagnosis,
    )


@dataclass(frozen=True)
class RankSeries:
    """Per-window histories of one rank for the sparklines (oldest first; None = N/A)."""

    step_s: tuple[float | None, ...]
    loader_frac: tuple[float | None, ...]
    exposed_comm_frac: tuple[float | None, ...]
    gpu_util_pct: tuple[float | None, ...]


def _window_step_s(w: Window) -> float | None:
    return w.step_time_p50_s if w.step_time_p50_s is not None else w.step_time_mean_s


def rank_series(snapshot: Snapshot, rank: RankView, points: int = HISTORY_POINTS) -> RankSeries:
    """The sparkline data for one rank, and its GPU's utilization when it is known."""
    windows = rank.windows[-points:]
    step, loader, comm = [], [], []
    for w in windows:
        step_s = _window_step_s(w)
        step.append(step_s)
        mean_step = w.step_time_mean_s
        loader.append(w.loader_wait_s / w.step_time_sum_s if (w.loader_batches and w.step_time_sum_s > 0) else None)
        exposed = w.exposed_comm_s
        comm.append(exposed / mean_step if (exposed is not None and mean_step) else None)
    util: list[float | None] = []
    uuid = rank.hello.device_uuid
    if uuid:
        for sample in snapshot.gpu_history[-points:]:
            reading = next((g for g in sample.gpus if g.uuid == uuid), None)
            util.append(reading.util_pct if reading is not None else None)
    return RankSeries(tuple(step), tuple(loader), tuple(comm), tuple(util))


def phases(stats: RankStats) -> list[tuple[str, float | None]]:
    """A step split into loader / forward / backward / exposed comm / other, seconds per step."""
    return [
        ("loader", stats.loader_wait_s),
        ("forward", stats.forward_s),
        ("backward", stats.backward_s),
        ("exposed comm", stats.exposed_comm_s),
        ("other", stats.other_s),
    ]
