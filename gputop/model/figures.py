"""Every figure the user sees, computed once per snapshot: per rank, per run, per GPU.

``summarize(snapshot)`` joins the ranks to the GPUs once, runs ``rank_stats``
once per rank over the span (or slides the figures a ``SpanFigures`` keeps:
the same numbers), and averages each GPU's utilization once.  The dashboard's
table, detail screen and header, ``gputop report`` and the diagnosis rules all
read the ``Figures`` it returns, so "loader wait 41%" is one number wherever
it is shown, and the findings' evidence quotes the same value the table
shows.  A snapshot in, frozen figures out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from gputop.combine import PHASE_NAMES, window_exposed_comm_frac, window_loader_wait_frac, window_step_s
from gputop.model.frames import RankFrames, rank_frames
from gputop.model.join import GpuAssignment, join_ranks_to_gpus, normalize_uuid
from gputop.model.rank_stats import RankStats, recent
from gputop.model.samples import GpuReading, GpuSample, HostSample
from gputop.model.snapshot import LOST, RankSnapshot, RunSnapshot, Snapshot, Status
from gputop.model.span import SpanFigures
from gputop.model.sums import rank_stats
from gputop.peaks import mfu as mfu_of
from gputop.peaks import rank_peak
from gputop.protocol import MAX_STACKS_TOP, Hello, Window

# The span the live figures cover: 20 windows, long enough to smooth one slow
# step, short enough to follow a change.  The table, the header and the
# diagnosis all read this one span.
SPAN_S = 10.0

# A step's phases, in the order they are drawn (gputop.combine.PHASES declares them).
Phase = str
PHASES: tuple[Phase, ...] = PHASE_NAMES


@dataclass(frozen=True)
class RankFigures:
    """One rank over the span: its snapshot, the windows in the span, their figures, its GPU."""

    snapshot: RankSnapshot
    windows: tuple[Window, ...]  # those that ended within the span
    stats: RankStats
    gpu: GpuReading | None = None  # the GPU NVML sees this rank on, by device UUID
    gpu_util_pct: float | None = None  # that GPU's mean utilization over the span
    # The best CPU matmul peak its run's ranks measured on its host with as many threads (``host_cpu_peaks``):
    # ranks of one job on one kind of core have one peak, whichever measured it under less load.
    host_cpu_peak: float | None = None

    @property
    def rank(self) -> int:
        return self.snapshot.rank

    @property
    def run_id(self) -> str:
        return self.snapshot.run_id

    @property
    def key(self) -> str:
        return self.snapshot.key

    @property
    def hello(self) -> Hello:
        return self.snapshot.hello

    @property
    def status(self) -> Status:
        return self.snapshot.status

    @cached_property  # the rules ask a dozen times per rank and refresh
    def active(self) -> bool:
        """Reporting (live or finished) with windows in the span: its rates are current."""
        return self.snapshot.status != LOST and bool(self.windows)

    @property
    def on_cuda(self) -> bool:
        return (self.hello.device or "").startswith("cuda")

    @cached_property
    def work_peak(self) -> tuple[float | None, str]:
        """The FLOP/s the rank's device could do for its step's mix of dtypes, and what it is (or why it is N/A):
        ``gputop.peaks.rank_peak``, a GPU named as NVML (else torch) names it.  docs/mfu.md."""
        hello = self.hello
        name = (self.gpu.name if self.gpu is not None else None) or hello.device_name
        peak, what = rank_peak(
            self.on_cuda,
            name,
            hello.flops_mix,
            bool(hello.tf32_matmul),
            bool(hello.tf32_cudnn),
            self.host_cpu_peak or hello.cpu_peak_flops,
            hello.cpu_peak_cost_s,
        )
        own = hello.cpu_peak_flops
        if not self.on_cuda and peak and own and peak > own:
            what = (
                f"the best of its host's ranks' fp32 matmuls on their own threads (its own read {own / 1e9:.3g} "
                "GFLOP/s)"
            )
        return peak, what

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization: the FLOP/s the rank's steps achieved over its device's peak (None: N/A)."""
        return mfu_of(self.stats.work.achieved_flops_per_s, self.work_peak[0])

    @cached_property
    def frames(self) -> RankFrames | None:
        """Where the training thread was over the span, its most-sampled places as many as the wire carries.

        Tallied once a summary, however many rules, the report and the exporter read it
        (``gputop.model.frames.span_frames`` gives its first places).  None: no stack samples.
        """
        return rank_frames(self.snapshot, since_t=self.windows[0].t0 if self.windows else None, top=MAX_STACKS_TOP)

    @cached_property
    def own_s(self) -> float | None:
        """Per-step time the rank spends on its own work: step time minus exposed comm.

        None when either is unmeasured: the ▲ slowest marker and the straggler
        finding both come from this one figure.  Cached: the straggler rule
        compares every rank with every other (a million reads at 1,024 ranks).
        """
        step, exposed = self.stats.step.mean_s, self.stats.phases.exposed_comm_s
        if step is None or exposed is None:
            return None
        return max(step - exposed, 0.0)


def stat_reader(name: str) -> Callable[[RankFigures], float | None]:
    """A reader of one ``RankStats`` figure by name (a phase's ``seconds`` in gputop.combine.PHASES)."""
    return lambda rank: getattr(rank.stats.phases, name)


@dataclass(frozen=True)
class GputopCost:
    """What gputop itself costs a run, from the ranks' self-accounting (None: not reported)."""

    cpu_frac: float | None  # gputop's CPU over the ranks' CPU, mean over ranks
    reporter_cpu_pct: float | None  # one rank's reporter thread, mean over ranks; 100 = one core
    hook_s_per_step: float | None  # training-thread time inside gputop per step, mean over ranks
    sent_bytes_per_s: float | None  # all ranks together


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def gputop_cost(ranks: Sequence[RankFigures]) -> GputopCost:
    stats = [r.stats for r in ranks]
    sent = [s.cost.sent_bytes_per_s for s in stats if s.cost.sent_bytes_per_s is not None]
    return GputopCost(
        cpu_frac=_mean([s.cost.cpu_frac for s in stats]),
        reporter_cpu_pct=_mean([s.cost.reporter_cpu_pct for s in stats]),
        hook_s_per_step=_mean([s.cost.hook_s_per_step for s in stats]),
        sent_bytes_per_s=sum(sent) if sent else None,
    )


@dataclass(frozen=True)
class RunFigures:
    """One run: every rank's figures, in rank order."""

    snapshot: RunSnapshot
    ranks: tuple[RankFigures, ...]

    @property
    def run_id(self) -> str:
        return self.snapshot.run_id

    @property
    def name(self) -> str:
        return self.snapshot.name or self.snapshot.run_id

    @property
    def world_size(self) -> int:
        return self.snapshot.world_size

    @property
    def active(self) -> list[RankFigures]:
        """Ranks reporting now with data in the span (lost ranks' numbers are stale)."""
        return [r for r in self.ranks if r.active]

    @property
    def lost(self) -> list[RankFigures]:
        return [r for r in self.ranks if r.status == LOST]

    @property
    def gputop_cost(self) -> GputopCost:
        """What gputop costs this run's ranks (lost ranks' figures included: they were paid)."""
        return gputop_cost(self.ranks)


@dataclass(frozen=True)
class Figures:
    """Everything shown or judged for one snapshot."""

    snapshot: Snapshot
    span_s: float | None  # None: each rank's whole history (the report)
    runs: tuple[RunFigures, ...] = ()
    assignments: tuple[GpuAssignment, ...] = ()  # every GPU with its ranks, from the one join
    gpu_util_pct: dict[str, float] = field(default_factory=dict)  # uuid -> mean over the span
    dashboard_cpu_pct: float | None = None  # this dashboard's (or recorder's) own CPU over the span; 100 = one core

    @property
    def t(self) -> float:
        return self.snapshot.t

    @property
    def gpu(self) -> GpuSample | None:
        return self.snapshot.gpu

    @property
    def host(self) -> HostSample | None:
        return self.snapshot.host

    def all_ranks(self) -> list[RankFigures]:
        return [rank for run in self.runs for rank in run.ranks]

    @cached_property
    def _by_key(self) -> dict[str, RankFigures]:
        return {r.key: r for r in self.all_ranks()}

    def rank(self, key: str) -> RankFigures | None:
        """A rank by its key, "run_id:rank" (a dict: the UI asks for ranks by key on every refresh)."""
        return self._by_key.get(key)

    def ranks_on_host(self) -> Counter[str]:
        """How many active ranks each host runs (of every run): they share its CPUs."""
        return Counter(r.hello.hostname for run in self.runs for r in run.active)


def summarize(
    snapshot: Snapshot,
    *,
    span_s: float | None = SPAN_S,
    between_ranks: Callable[[], None] | None = None,
    spans: SpanFigures | None = None,
) -> Figures:
    """Every rank's figures over the last ``span_s`` seconds of its windows (None: all of them).

    ``between_ranks`` is called before each rank: the dashboard's worker waits
    there while the user is typing, so a keypress does not share the
    interpreter with a thousand ranks' figures.  ``spans``, kept by a caller
    that summarizes again and again (the dashboard, the exporter), holds each
    rank's figures over the span from one call to the next and updates them
    with the windows that arrived and left: the same figures, for less.
    """
    if spans is not None and spans.span_s != span_s:
        raise ValueError(f"the spans kept cover {spans.span_s} s, not {span_s}")
    assignments = tuple(join_ranks_to_gpus(snapshot))
    gpu_of = _gpu_of_each_rank(assignments)
    since_t = None if span_s is None else snapshot.t - span_s
    util = mean_gpu_util_pct(snapshot.gpu_samples(), since_t=since_t)  # every host's GPUs, keyed by UUID
    runs = []
    for run in snapshot.runs:
        ranks = []
        cpu_peaks = host_cpu_peaks(run.ranks)
        for view in run.ranks:
            if between_ranks is not None:
                between_ranks()
            if spans is not None:
                windows, stats = spans.figures(view.key, view.windows)
            else:
                windows = tuple(view.windows if span_s is None else recent(view.windows, span_s))
                stats = rank_stats(windows)
            gpu = gpu_of.get((view.run_id, view.rank))
            ranks.append(
                RankFigures(
                    snapshot=view,
                    windows=windows,
                    stats=stats,
                    gpu=gpu,
                    gpu_util_pct=util.get(gpu.uuid) if gpu is not None else None,
                    host_cpu_peak=cpu_peaks.get((view.hello.hostname, view.hello.torch_threads)),
                )
            )
        runs.append(RunFigures(snapshot=run, ranks=tuple(ranks)))
    if spans is not None:
        spans.keep_only(view.key for run in snapshot.runs for view in run.ranks)
    own_cpu = _mean([h.gputop_cpu_pct for h in snapshot.host_history if since_t is None or h.t >= since_t])
    return Figures(
        snapshot=snapshot,
        span_s=span_s,
        runs=tuple(runs),
        assignments=assignments,
        gpu_util_pct=util,
        dashboard_cpu_pct=own_cpu,
    )


def host_cpu_peaks(ranks: Iterable[RankSnapshot]) -> dict[tuple[str, int | None], float]:
    """The best CPU matmul peak measured by a run's ranks on each host, per torch thread count: each rank measures
    once, and one that measured while its neighbours loaded the cores reads low (51 against 170 GFLOP/s in one
    job), so two ranks doing the same work would read MFU 35% and 19% (issue #56)."""
    best: dict[tuple[str, int | None], float] = {}
    for view in ranks:
        peak, key = view.hello.cpu_peak_flops, (view.hello.hostname, view.hello.torch_threads)
        if peak and peak > best.get(key, 0.0):
            best[key] = peak
    return best


def _gpu_of_each_rank(assignments: Sequence[GpuAssignment]) -> dict[tuple[str, int], GpuReading]:
    """Each rank's GPU by (run, rank): a DataParallel rank, on several, gets its own device's (where outputs
    gather)."""
    gpu_of: dict[tuple[str, int], GpuReading] = {}
    for a in assignments:
        for view in a.ranks:
            own = normalize_uuid(a.gpu.uuid) == normalize_uuid(view.hello.device_uuid)
            if own or (view.run_id, view.rank) not in gpu_of:
                gpu_of[(view.run_id, view.rank)] = a.gpu
    return gpu_of


def mean_gpu_util_pct(
    history: Iterable[GpuSample], *, since_t: float | None, until_t: float | None = None
) -> dict[str, float]:
    """Each GPU's mean NVML utilization over the samples from ``since_t`` to ``until_t``; N/A readings skipped."""
    sums: dict[str, list[float]] = {}
    for sample in history:
        if (since_t is not None and sample.t < since_t) or (until_t is not None and sample.t > until_t):
            continue
        for gpu in sample.gpus:
            if gpu.util_pct is not None:
                sums.setdefault(gpu.uuid, []).append(gpu.util_pct)
    return {uuid: sum(values) / len(values) for uuid, values in sums.items()}


@dataclass(frozen=True)
class RankSeries:
    """Per-window histories of one rank, oldest first (None = N/A in that window)."""

    step_s: tuple[float | None, ...]
    loader_wait_frac: tuple[float | None, ...]
    exposed_comm_frac: tuple[float | None, ...]
    gpu_util_pct: tuple[float | None, ...]  # per GPU sample; empty for a rank with no GPU


# One window's sparkline figures: step time, loader-wait share, exposed-comm share.
WindowFigures = tuple[float | None, float | None, float | None]


class WindowFiguresMemo:
    """Each window's sparkline figures, kept from one ``rank_series`` call to the next.

    The rank on screen has its newest 240 windows' figures read every refresh,
    and all but the newest one or two were read the refresh before, from the
    same window objects (the store keeps them, ``WindowHistory``): those are
    looked up by identity (the window is held with its figures, so the identity
    stays its own) rather than computed again.  Only the windows of the last
    call are kept.  Not thread-safe: one per caller.
    """

    def __init__(self) -> None:
        self._kept: dict[int, tuple[Window, WindowFigures]] = {}

    def of(self, windows: Sequence[Window]) -> list[WindowFigures]:
        last, kept = self._kept, {}
        out = []
        for w in windows:
            hit = last.get(id(w))
            if hit is None or hit[0] is not w:
                hit = (w, _window_figures(w))
            kept[id(w)] = hit
            out.append(hit[1])
        self._kept = kept
        return out


def _window_figures(w: Window) -> WindowFigures:
    return window_step_s(w), window_loader_wait_frac(w), window_exposed_comm_frac(w)


def rank_series(
    rank: RankSnapshot, gpu_history: Sequence[GpuSample], points: int, memo: WindowFiguresMemo | None = None
) -> RankSeries:
    """The newest ``points`` windows' figures, each defined as in ``rank_stats`` for one window.

    ``memo``: what the last call computed, for a caller that asks again every refresh.
    """
    windows = rank.windows[-points:]
    util: list[float | None] = []
    uuid = rank.hello.device_uuid
    if uuid:
        for sample in gpu_history[-points:]:
            reading = next((g for g in sample.gpus if g.uuid == uuid), None)
            util.append(reading.util_pct if reading is not None else None)
    per_window = memo.of(windows) if memo is not None else [_window_figures(w) for w in windows]
    step, loader, exposed = zip(*per_window, strict=True) if per_window else ((), (), ())
    return RankSeries(step_s=step, loader_wait_frac=loader, exposed_comm_frac=exposed, gpu_util_pct=tuple(util))
