"""What a rank's figures are: ``RankStats``, each figure's meaning, over a span of its windows.

The figures come in groups, one struct each, so a reader finds a figure by what it is about
(``stats.cpu.starved_frac``, ``stats.stalls.period_steps``) and each group is built by one
small function.  Each group is a msgspec struct rather than a frozen dataclass: built for
every rank on every refresh, and a frozen dataclass sets its fields one ``object.__setattr__``
at a time (three times as long).  Numbers only: no cycles, so the garbage collector need not
track them.

``gputop.model.sums`` computes them (``rank_stats``, and the sliding ``SpanSums``
the dashboard keeps); how each window field combines is declared in
``gputop.combine``.  "Loader wait %" is time blocked in the tracked loader's
``next()`` divided by wall step time, over the same steps, everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from gputop.model.collectives import CollectiveFigures
from gputop.protocol import Window


class StepTimes(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """How long the steps took, and how many ran."""

    per_s: float | None = None  # steps a second
    mean_s: float | None = None
    p50_s: float | None = None
    p95_s: float | None = None
    max_s: float | None = None
    gpu_p50_s: float | None = None  # the step's span on the GPU (CUDA events), the windows' median
    samples_per_s: float | None = None


class PhaseTimes(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Where a step's time goes, a step each (the phases of ``gputop.combine.PHASES``, by their ``seconds``)."""

    loader_wait_s: float | None = None  # blocked in the tracked loader's next()
    loader_wait_frac: float | None = None  # of wall step time
    forward_s: float | None = None  # per optimizer step: DDP's timed micro-batch x micro_batches
    backward_s: float | None = None
    optimizer_s: float | None = None  # in the optimizer's step (None: no optimizer hook timed it)
    comm_s: float | None = None
    overlap_s: float | None = None
    exposed_comm_s: float | None = None
    exposed_comm_frac: float | None = None  # of wall step time
    # The standard error of the shares, from their per-window values (None: fewer than 3 windows),
    # widened for few windows (see ``standard_error``): a share near a threshold is decided by
    # its band, share +- 2 errors, a 95% interval, not by its point.
    loader_wait_frac_se: float | None = None
    exposed_comm_frac_se: float | None = None
    # Forwards per optimizer step: k under gradient accumulation, where DDP times only the
    # synchronising micro-batch and forward_s/backward_s are scaled by k (an estimate).
    micro_batches: float | None = None
    other_s: float | None = None  # step time outside every measured phase (see ``other_seconds``)
    # Where forward, backward and comm come from: "ddp" (DDP's logger), "hooks" (module hooks and the timed
    # collectives, any other stack), "cuda events"; None when not measured.
    source: str | None = None


class MemoryUse(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The device's memory as the caching allocator sees it (None: not CUDA)."""

    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    peak_bytes: int | None = None  # the span's highest
    total_bytes: int | None = None
    alloc_retries: int | None = None
    ooms: int | None = None


class CpuUse(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The rank process's CPU and its loader workers', and the wait for a CPU (the run-queue wait)."""

    pct: float | None = None  # 100 = one core
    rss_bytes: int | None = None
    threads: int | None = None
    workers: int | None = None
    workers_pct: float | None = None
    main_wait_frac: float | None = None  # the training thread's wait over wall time
    starved_frac: float | None = None  # the rank's and its workers' wait over (wait + CPU time)
    workers_starved_frac: float | None = None  # the workers' alone
    demand_cores: float | None = None  # the rank's and its workers' threads ready to run, on average (CPU + wait)


class StallFigures(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Steps of at least STALL_FACTOR x the median step (``gputop.model.stalls``; None: too few steps to say)."""

    steps: int | None = None
    mean_s: float | None = None  # a stall step's mean duration
    frac: float | None = None  # time lost to stalls (beyond a median step each) over all step time
    loader_frac: float | None = None  # of the named stall steps' time, the share spent waiting for a batch
    in_comm_frac: float | None = None  # of the stalls' excess, the share this rank waited in exposed comm
    period_steps: int | None = None  # the stalls fall every N steps (from their step numbers)
    regular: bool | None = None  # False: they fall at irregular steps; None: too few numbered stalls to say
    level_shift: bool | None = None  # the steps turned slow and stayed so: a new level, not stops


class CompileFigures(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """torch.compile over the span, from dynamo's own record (gputop.reporter.probes.compile).

    None: nothing compiled.
    """

    compiles: int | None = None  # frames compiled: first compiles and recompiles
    recompiles: int | None = None  # of which recompiles (a guard failed: a new shape, a new dtype)
    seconds: float | None = None  # time spent compiling, every compile's
    frac: float | None = None  # ``seconds`` over the span's wall time
    recompile_s: float | None = None  # the recompiles' part of ``seconds`` (a window's in its recompiles' proportion)
    recompile_frac: float | None = None  # recompile_s over the span's wall time
    graph_breaks: int | None = None  # graph breaks so far (dynamo's running count)


class OwnCost(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What gputop itself cost the rank (the reporter's self-accounting); None from older reporters."""

    reporter_cpu_pct: float | None = None  # the reporter thread, 100 = one core
    hook_s_per_step: float | None = None  # training-thread time inside gputop per step
    cpu_frac: float | None = None  # gputop's CPU (thread + hooks) over the rank process's CPU
    sent_bytes_per_s: float | None = None


class StepWork(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The work each step does (docs/mfu.md), over the steps whose FLOPs were counted and did not run under
    the counting itself (None: not counted)."""

    flops_per_step: float | None = None  # forward and backward
    achieved_flops_per_s: float | None = None


class RankStats(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A rank over a span of windows, its figures in groups.  None means not measured (N/A)."""

    windows: int
    steps: int
    dropped: int  # windows the reporter could not send
    step: StepTimes = StepTimes()
    phases: PhaseTimes = PhaseTimes()
    memory: MemoryUse = MemoryUse()
    cpu: CpuUse = CpuUse()
    stalls: StallFigures = StallFigures()
    compile: CompileFigures = CompileFigures()
    cost: OwnCost = OwnCost()
    work: StepWork = StepWork()
    # Each kind of collective on each process group, a step (gputop.model.collectives), most exposed first.
    collectives: tuple[CollectiveFigures, ...] = ()


def recent(windows: Sequence[Window], span_s: float) -> list[Window]:
    """The windows that ended within ``span_s`` of the newest one."""
    if not windows:
        return []
    cutoff = windows[-1].t1 - span_s
    return [w for w in windows if w.t1 > cutoff]
