"""What the dashboard shows, laid out from one refresh's figures off the UI thread.

``build_view`` turns the ``Figures`` of a snapshot (``gputop.model.figures``)
and the shown findings into an immutable ``DashboardView``: per-rank rows with
their figures and the reasons for every N/A, per-GPU rows with the ranks
joined to them, per-run summaries.  It computes no figure of its own, so the
table says what the report and the findings say.  Pure and free of Textual,
so the worker thread can run it and tests can check it directly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from statistics import median

from gputop.combine import phase_seconds
from gputop.diagnose.findings import Finding
from gputop.diagnose.waste import idle_gpus
from gputop.model.figures import (
    PHASES,
    Figures,
    GputopCost,
    Phase,
    RankFigures,
    RankSeries,
    RunFigures,
    WindowFiguresMemo,
    rank_series,
)
from gputop.model.jobs import job_text
from gputop.model.rank_stats import RankStats
from gputop.model.samples import GpuProcess, GpuReading
from gputop.model.snapshot import LIVE, SNAPSHOT_HISTORY_WINDOWS, RankSnapshot, Snapshot, Status
from gputop.model.work import work_entry
from gputop.tui.na import na_reasons


@dataclass(frozen=True)
class RankRow:
    """One rank as a table row: identity, its figures over the span, and N/A reasons."""

    key: str  # "run_id:rank", the table's row key
    run_id: str
    run_name: str
    rank: int
    host: str
    gpu: str  # NVML index "3"; "(3)" CUDA index on another host; "cpu"; "-" not reported
    stats: RankStats
    status: Status
    status_reason: str
    na: dict[str, str] = field(default_factory=dict)  # column -> why it is N/A
    slowest: bool = False  # named by the straggler finding on screen
    mfu: float | None = None  # model FLOPs utilization (docs/mfu.md); None: N/A, ``na["mfu"]`` says why

    @property
    def phases(self) -> tuple[tuple[Phase, float | None], ...]:
        """Seconds per step in each phase, for the phase bar."""
        return tuple(phase_seconds(self.stats.phases).items())


@dataclass(frozen=True)
class HostRow:
    """One host of a run, as the summary row its ranks fold under.

    Summaries of the ranks' own figures (no figure of its own): the median step,
    the host's samples/s, the mean of the ranks' shares and phases.
    """

    key: str  # "host:run_id:hostname", the table's row key
    run_id: str
    run_name: str
    host: str
    ranks: tuple[RankRow, ...]
    step_time_p50_s: float | None  # median over its ranks
    samples_per_s: float | None  # sum over its ranks
    loader_wait_frac: float | None  # mean over its ranks
    exposed_comm_frac: float | None
    cpu_pct: float | None
    mfu: float | None  # mean over its ranks that count it
    phases: tuple[tuple[Phase, float | None], ...]  # mean seconds per step over its ranks
    live: int

    @property
    def slowest(self) -> bool:
        return any(r.slowest for r in self.ranks)


@dataclass(frozen=True)
class GpuRow:
    """One GPU with the ranks found on it and the processes on it that do not report."""

    reading: GpuReading
    ranks: tuple[str, ...]  # "r0", or "run:r0" when several runs share the machine
    unobserved: tuple[GpuProcess, ...]
    hostname: str = ""  # the host it is on, from its node sampler; "" this dashboard's machine
    rank_keys: tuple[str, ...] = ()  # "run_id:rank" of each rank on it, for the rank detail screen
    from_other_namespace: tuple[GpuProcess, ...] = ()  # its ranks' own processes, under the host's PIDs


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
    gputop_cost: GputopCost  # what gputop costs its ranks
    job: str = ""  # the scheduler's names for it (Slurm job, pod, torchrun id), "" outside one


@dataclass(frozen=True, eq=False)
class DashboardView:
    """Everything the main screen shows at one moment (compared by identity)."""

    figures: Figures
    runs: tuple[RunSummary, ...]
    rank_rows: tuple[RankRow, ...]
    gpu_rows: tuple[GpuRow, ...]
    gpu_unavailable: str | None  # why there is no GPU data; None when there is (or none yet)
    findings: tuple[Finding, ...]
    diagnosis: str  # "off" (no rules), "ok", or "failed: <reason>"
    host_rows: tuple[HostRow, ...] = ()  # per run and host, in the order the hosts' first ranks appear
    cpu_sharing: str | None = None  # who else uses this host's CPUs, when they take a real part

    @cached_property
    def idle_gpus(self) -> tuple[float, int] | None:
        """GPU-hours the runs' GPUs sit idle every hour, and how many GPUs (gputop.diagnose.waste.idle_gpus)."""
        return idle_gpus(self.figures.runs, self.figures.gpu_util_pct)

    @property
    def hosts(self) -> int:
        """Hosts with a reporting rank (the header counts them)."""
        return len({row.host for row in self.rank_rows})

    @property
    def grouped(self) -> bool:
        """Ranks on more than one host: the table groups them under host rows."""
        return self.hosts > 1

    @property
    def snapshot(self) -> Snapshot:
        return self.figures.snapshot

    @property
    def empty(self) -> bool:
        """Nothing reports yet."""
        return not self.snapshot.runs

    def rank(self, key: str) -> RankSnapshot | None:
        """The full RankSnapshot behind a row key."""
        figures = self.figures.rank(key)
        return figures.snapshot if figures is not None else None

    def series(self, key: str, memo: WindowFiguresMemo | None = None) -> RankSeries | None:
        """The histories of one rank, for its sparklines (computed once per view and rank).

        ``memo``: the figures of windows an earlier view's series already read.
        """
        cache = self._series_by_key
        if key not in cache:
            rank = self.rank(key)
            history = self.snapshot.gpu_history_of(rank.hello.hostname) if rank is not None else ()
            cache[key] = rank_series(rank, history, SNAPSHOT_HISTORY_WINDOWS, memo) if rank is not None else None
        return cache[key]

    @cached_property
    def _series_by_key(self) -> dict[str, RankSeries | None]:
        return {}

    def row(self, key: str) -> RankRow | None:
        return self._rows_by_key.get(key)

    def for_time_travel(self) -> DashboardView:
        """This view as time travel keeps it: every figure, row and finding, but windows only where drawn.

        A live view holds each rank's newest windows; kept as a past view it would
        hold them as objects long after the store has encoded them
        (``WindowHistory``): at 1,024 ranks the past views held 70 windows a rank,
        ~80 MiB.  The ranks whose sparklines were computed (the focused one) keep
        their windows and sparklines; another rank selected while travelling shows
        its figures and GPU history, without step sparklines.
        """
        drawn = self._series_by_key
        runs = []
        for run in self.figures.runs:
            ranks = tuple(
                r if r.key in drawn else replace(r, snapshot=replace(r.snapshot, windows=()), windows=())
                for r in run.ranks
            )
            shown = replace(run.snapshot, ranks=tuple(r.snapshot for r in ranks))
            runs.append(replace(run, snapshot=shown, ranks=ranks))
        snapshot = replace(self.snapshot, runs=tuple(run.snapshot for run in runs))
        past = replace(self, figures=replace(self.figures, snapshot=snapshot, runs=tuple(runs)))
        past._series_by_key.update(drawn)
        return past

    @cached_property
    def _rows_by_key(self) -> dict[str, RankRow]:
        return {row.key: row for row in self.rank_rows}


def straggler_keys(findings: Sequence[Finding]) -> set[str]:
    """The ranks the straggler finding names: the table marks these, so the two never disagree."""
    return {f"{f.run_id}:{rank}" for f in findings if f.cause == "straggler" for rank in f.ranks}


def _gpu_text(rank: RankFigures) -> str:
    """NVML index "3"; "0+3" a DataParallel rank on 3 more; "(3)" a CUDA index NVML here cannot see; "cpu"; "-"."""
    device = rank.hello.device or ""
    if rank.gpu is not None:
        spans = len(rank.hello.device_uuids or ())
        return f"{rank.gpu.index}+{spans - 1}" if spans > 1 else str(rank.gpu.index)  # "0+3": DataParallel
    if device.startswith("cpu"):
        return "cpu"
    if device.startswith("cuda:"):
        return f"({device[5:]})"
    return "-"


def _na_with_work(rank: RankFigures) -> dict[str, str]:
    """The rank's N/A reasons, with the MFU's where it is N/A (docs/mfu.md)."""
    reasons = na_reasons(rank.snapshot, rank.stats)
    if rank.mfu is None:
        entry = work_entry(rank)
        reasons["mfu"] = f"MFU: {entry['work_note'] or 'not counted'}"
    return reasons


def _rank_rows(run: RunFigures, slowest: set[str]) -> list[RankRow]:
    return [
        RankRow(
            key=rank.key,
            run_id=run.run_id,
            run_name=run.name,
            rank=rank.rank,
            host=rank.hello.hostname,
            gpu=_gpu_text(rank),
            stats=rank.stats,
            status=rank.status,
            status_reason=rank.snapshot.status_reason,
            na=_na_with_work(rank),
            slowest=rank.key in slowest,
            mfu=rank.mfu,
        )
        for rank in run.ranks
    ]


def _run_summary(run: RunFigures, t: float) -> RunSummary:
    rates = [r.stats.step.per_s for r in run.ranks if r.status == LIVE and r.stats.step.per_s is not None]
    return RunSummary(
        run_id=run.run_id,
        name=run.name,
        world_size=run.world_size,
        live=run.snapshot.live_ranks,
        reporting=len(run.ranks),
        uptime_s=t - run.snapshot.first_seen_t,
        steps_per_s=median(rates) if rates else None,
        gputop_cost=run.gputop_cost,
        job=job_text(run.snapshot.ranks[0].hello, short=True) if run.snapshot.ranks else "",
    )


def _mean_of(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    # fsum, not statistics.mean: its exact fractions cost 0.1 ms a call, 128 ms a refresh at 1,024 ranks.
    return math.fsum(known) / len(known) if known else None


def _host_rows(rows: Sequence[RankRow]) -> tuple[HostRow, ...]:
    groups: dict[tuple[str, str], list[RankRow]] = {}
    for row in rows:
        groups.setdefault((row.run_id, row.host), []).append(row)
    result = []
    for (run_id, host), ranks in groups.items():
        steps = [r.stats.step.p50_s for r in ranks if r.stats.step.p50_s is not None]
        samples = [r.stats.step.samples_per_s for r in ranks if r.stats.step.samples_per_s is not None]
        per_rank = [dict(r.phases) for r in ranks]
        result.append(
            HostRow(
                key=f"host:{run_id}:{host}",
                run_id=run_id,
                run_name=ranks[0].run_name,
                host=host,
                ranks=tuple(ranks),
                step_time_p50_s=median(steps) if steps else None,
                samples_per_s=sum(samples) if samples else None,
                loader_wait_frac=_mean_of([r.stats.phases.loader_wait_frac for r in ranks]),
                exposed_comm_frac=_mean_of([r.stats.phases.exposed_comm_frac for r in ranks]),
                cpu_pct=_mean_of([r.stats.cpu.pct for r in ranks]),
                mfu=_mean_of([r.mfu for r in ranks]),
                # A phase some ranks do not measure (the optimizer's, from older reporters) is their mean
                # where measured; one none measures is left out, as on each rank's own bar.
                phases=tuple(
                    (phase, _mean_of([p[phase] for p in per_rank if phase in p]))
                    for phase in PHASES
                    if any(phase in p for p in per_rank)
                ),
                live=sum(1 for r in ranks if r.status == LIVE),
            )
        )
    return tuple(result)


# The host counts as shared when its CPUs are this busy and processes other than the
# ranks (this dashboard included: it is one more process on the same cores) take at
# least this much of them: then step times, stragglers and waits reflect the
# sharing as much as the job.
SHARED_BUSY_PCT = 90.0
SHARED_OTHERS_CORES = 0.5


def cpu_sharing(figures: Figures) -> str | None:
    """One line saying who shares this host's CPUs with the ranks, when others take a real part; else None."""
    host = figures.host
    if host is None or host.cpu_pct is None or not host.cpu_count or host.cpu_pct < SHARED_BUSY_PCT:
        return None
    busy_cores = host.cpu_pct / 100.0 * host.cpu_count
    ranks = [p for p in host.processes if p.cpu_pct is not None]
    ranks_cores = sum((p.cpu_pct or 0.0) + (p.children_cpu_pct or 0.0) for p in ranks) / 100.0
    own_cores = (host.gputop_cpu_pct or 0.0) / 100.0
    others_cores = busy_cores - ranks_cores - own_cores
    if others_cores + own_cores < SHARED_OTHERS_CORES:
        return None
    per_rank = f", {ranks_cores / len(ranks) * 100:.0f}% of a core each" if ranks else ""
    load = f", load {host.load_1m:.1f}" if host.load_1m is not None else ""
    return (
        f"this host's {host.cpu_count} CPUs are {host.cpu_pct:.0f}% busy{load}: ranks {ranks_cores:.1f} cores"
        f"{per_rank}, this dashboard {own_cores:.1f}, other processes {others_cores:.1f}; "
        "step times and waits reflect the sharing"
    )


def build_view(figures: Figures, findings: Sequence[Finding] = (), diagnosis: str = "off") -> DashboardView:
    """The whole main screen's content for one refresh."""
    snapshot = figures.snapshot
    several_runs = len(figures.runs) > 1
    names = {run.run_id: run.name for run in figures.runs}
    gpu_rows = tuple(
        GpuRow(
            reading=a.gpu,
            ranks=tuple(
                (f"{names[r.run_id]}:" if several_runs else "")
                + f"r{r.rank}"
                + (" DP" if r.hello.data_parallel else "")
                for r in a.ranks
            ),
            unobserved=a.unobserved,
            hostname=a.hostname,
            rank_keys=tuple(r.key for r in a.ranks),
            from_other_namespace=a.from_other_namespace,
        )
        for a in figures.assignments
    )
    slowest = straggler_keys(findings)
    rank_rows = tuple(row for run in figures.runs for row in _rank_rows(run, slowest))
    return DashboardView(
        figures=figures,
        runs=tuple(_run_summary(run, snapshot.t) for run in figures.runs),
        rank_rows=rank_rows,
        gpu_rows=gpu_rows,
        gpu_unavailable=snapshot.gpu.unavailable if snapshot.gpu is not None else None,
        findings=tuple(findings),
        diagnosis=diagnosis,
        host_rows=_host_rows(rank_rows),
        cpu_sharing=cpu_sharing(figures),
    )
