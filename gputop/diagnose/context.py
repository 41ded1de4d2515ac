"""What the rules read: a snapshot digested once into per-run, per-rank figures.

Each rank's recent windows go through ``rank_stats`` exactly once, so a rule
never re-walks a long history, and every rule sees the same numbers the
dashboard shows.  Ranks that are lost (silent, disconnected) are kept apart:
their last numbers are stale, so no rule about rates reads them.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from gputop.collect.join import GpuAssignment, join_ranks_to_gpus
from gputop.collect.samples import GpuReading, GpuSample, HostSample
from gputop.collect.store import LOST, RankView, RunView, Snapshot
from gputop.diagnose.thresholds import MIN_STEPS
from gputop.protocol import Hello, Window
from gputop.stats import RankStats, rank_stats, recent


@dataclass(frozen=True)
class RankFacts:
    """One rank: its static facts, its recent windows and their summary."""

    rank: int
    hello: Hello
    windows: tuple[Window, ...]
    stats: RankStats
    gpu: GpuReading | None = None  # the GPU NVML sees this rank on, by device UUID
    gpu_util_pct: float | None = None  # that GPU's mean utilization over the span

    @property
    def measured(self) -> bool:
        """Enough steps in the span for shares of step time to mean something."""
        return self.stats.steps >= MIN_STEPS and self.stats.step_time_mean_s is not None

    @property
    def on_cuda(self) -> bool:
        return (self.hello.device or "").startswith("cuda")

    @property
    def exposed_comm_frac(self) -> float | None:
        """Exposed communication share, with a single-process run counted as none.

        A world of one rank has no gradient exchange, so 0 is a measurement
        there, not a guess; anywhere else a missing figure stays None.
        """
        if self.stats.exposed_comm_frac is not None:
            return self.stats.exposed_comm_frac
        return 0.0 if self.hello.world_size <= 1 else None

    @property
    def own_s(self) -> float | None:
        """Per-step time this rank spends on its own work: step time minus exposed comm."""
        step = self.stats.step_time_mean_s
        exposed = self.stats.exposed_comm_s
        if step is None or exposed is None:
            return None
        return max(step - exposed, 0.0)


@dataclass(frozen=True)
class RunFacts:
    """One run: its measured ranks, those it lost, and the GPUs it is on."""

    run: RunView
    ranks: tuple[RankFacts, ...]  # live or finished ranks with windows in the span
    lost: tuple[RankView, ...]

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def measured(self) -> list[RankFacts]:
        return [r for r in self.ranks if r.measured]

    @property
    def world_size(self) -> int:
        return self.run.world_size

    @property
    def hostnames(self) -> set[str]:
        return {r.hello.hostname for r in self.ranks}


@dataclass(frozen=True)
class MachineFacts:
    """Everything the rules look at for one snapshot."""

    snapshot: Snapshot
    span_s: float
    runs: tuple[RunFacts, ...]
    assignments: tuple[GpuAssignment, ...] = ()
    gpu_util_pct: dict[str, float] = field(default_factory=dict)  # uuid -> mean over the span

    @property
    def gpu(self) -> GpuSample | None:
        return self.snapshot.gpu

    @property
    def host(self) -> HostSample | None:
        return self.snapshot.host


def digest(snapshot: Snapshot, span_s: float) -> MachineFacts:
    """Summarise every run's ranks over the last ``span_s`` seconds of their windows."""
    assignments = tuple(join_ranks_to_gpus(snapshot)) if snapshot.gpu is not None else ()
    gpu_by_rank: dict[tuple[str, int], GpuReading] = {}
    for assignment in assignments:
        for view in assignment.ranks:
            gpu_by_rank[(view.run_id, view.rank)] = assignment.gpu
    util = mean_gpu_util_pct(snapshot.gpu_history, since_t=snapshot.t - span_s)

    runs = []
    for run in snapshot.runs:
        facts, lost = [], []
        for view in run.ranks:
            if view.status == LOST:
                lost.append(view)
                continue
            windows = tuple(recent(view.windows, span_s))
            if not windows:
                continue
            gpu = gpu_by_rank.get((view.run_id, view.rank))
            facts.append(
                RankFacts(
                    rank=view.rank,
                    hello=view.hello,
                    windows=windows,
                    stats=rank_stats(windows),
                    gpu=gpu,
                    gpu_util_pct=util.get(gpu.uuid) if gpu is not None else None,
                )
            )
        runs.append(RunFacts(run=run, ranks=tuple(facts), lost=tuple(lost)))
    return MachineFacts(snapshot=snapshot, span_s=span_s, runs=tuple(runs), assignments=assignments, gpu_util_pct=util)


def mean_gpu_util_pct(history: Sequence[GpuSample], *, since_t: float) -> dict[str, float]:
    """Each GPU's mean NVML utilization over the samples since ``since_t``; N/A readings skipped."""
    sums: dict[str, list[float]] = {}
    for sample in history:
        if sample.t < since_t:
            continue
        for gpu in sample.gpus:
            if gpu.util_pct is not None:
                sums.setdefault(gpu.uuid, []).append(gpu.util_pct)
    return {uuid: sum(values) / len(values) for uuid, values in sums.items()}


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def ranks_text(ranks: Sequence[int]) -> str:
    """'rank 3', 'ranks 0, 1', 'ranks 0-7' for a title."""
    ordered = sorted(set(ranks))
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"ranks {ordered[0]}-{ordered[-1]}"
    return "ranks " + ", ".join(str(r) for r in ordered)


def name_matches(device_name: str | None, fragments: Sequence[str]) -> bool | None:
    """Whether a GPU name contains one of the fragments at a word start; None if no name."""
    if not device_name:
        return None
    name = device_name.lower()
    return any(re.search(r"(?<![a-z0-9])" + re.escape(fragment), name) for fragment in fragments)


def pct(frac: float) -> float:
    """A fraction as a percentage, for evidence and titles."""
    return frac * 100.0
