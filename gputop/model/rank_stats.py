"""What a rank's figures are: ``RankStats``, each figure's meaning, over a span of its windows.

``gputop.model.sums`` computes them (``rank_stats``, and the sliding ``SpanSums``
the dashboard keeps); how each window field combines is declared in
``gputop.combine``.  "Loader wait %" is time blocked in the tracked loader's
``next()`` divided by wall step time, over the same steps, everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from gputop.combine import OWN_PHASES, other_seconds
from gputop.model.collectives import CollectiveFigures
from gputop.protocol import Window


class RankStats(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A rank over a span of windows.  None means not measured (N/A).

    A msgspec struct rather than a frozen dataclass: built for every rank on
    every refresh, and a frozen dataclass sets its 50 fields one
    ``object.__setattr__`` at a time (three times as long).  Numbers only: no
    cycles, so the garbage collector need not track it.
    """

    windows: int
    steps: int
    steps_per_s: float | None
    step_time_mean_s: float | None
    step_time_p50_s: float | None
    step_time_p95_s: float | None
    step_time_max_s: float | None
    gpu_step_time_p50_s: float | None
    samples_per_s: float | None
    loader_wait_s: float | None  # per step
    loader_wait_frac: float | None  # of wall step time
    forward_s: float | None  # per optimizer step: DDP's timed micro-batch x micro_batches
    backward_s: float | None
    comm_s: float | None
    overlap_s: float | None
    exposed_comm_s: float | None
    exposed_comm_frac: float | None  # of wall step time
    optimizer_s: float | None  # per step, in the optimizer's step (None: no optimizer hook timed it)
    mem_allocated_bytes: int | None
    mem_reserved_bytes: int | None
    mem_peak_bytes: int | None
    mem_total_bytes: int | None
    alloc_retries: int | None
    ooms: int | None
    cpu_pct: float | None
    rss_bytes: int | None
    threads: int | None
    workers: int | None
    workers_cpu_pct: float | None
    dropped: int
    # CPU contention, from the run-queue wait (ready to run, no CPU free):
    main_cpu_wait_frac: float | None = None  # the training thread's wait over wall time
    cpu_starved_frac: float | None = None  # the rank's and its workers' wait over (wait + CPU time)
    workers_cpu_starved_frac: float | None = None  # the workers' alone
    # The standard error of the shares, from their per-window values (None: fewer than 3 windows),
    # widened for few windows (see ``standard_error``): a share near a threshold is decided by
    # its band, share +- 2 errors, a 95% interval, not by its point.
    loader_wait_frac_se: float | None = None
    exposed_comm_frac_se: float | None = None
    # Forwards per optimizer step: k under gradient accumulation, where DDP times only the
    # synchronising micro-batch and forward_s/backward_s are scaled by k (an estimate).
    micro_batches: float | None = None
    cpu_demand_cores: float | None = None  # the rank's and its workers' threads ready to run, on average (CPU + wait)
    # Stalls: steps of at least STALL_FACTOR x the median step (None: too few steps to say).
    stall_steps: int | None = None
    stall_mean_s: float | None = None  # a stall step's mean duration
    stall_frac: float | None = None  # time lost to stalls (beyond a median step each) over all step time
    stall_loader_frac: float | None = None  # of the named stall steps' time, the share spent waiting for a batch
    stall_in_comm_frac: float | None = None  # of the stalls' excess, the share this rank waited in exposed comm
    stall_period_steps: int | None = None  # the stalls fall every N steps (from their step numbers)
    stall_regular: bool | None = None  # False: they fall at irregular steps; None: too few numbered stalls to say
    stall_level_shift: bool | None = None  # the steps turned slow and stayed so: a new level, not stops (Stalls)
    # What gputop itself cost the rank (the reporter's self-accounting); None from older reporters.
    reporter_cpu_pct: float | None = None  # the reporter thread, 100 = one core
    hook_s_per_step: float | None = None  # training-thread time inside gputop per step
    gputop_cpu_frac: float | None = None  # gputop's CPU (thread + hooks) over the rank process's CPU
    sent_bytes_per_s: float | None = None
    # Each kind of collective on each process group, a step (gputop.model.collectives), most exposed first.
    collectives: tuple[CollectiveFigures, ...] = ()
    # Where forward, backward and comm come from: "ddp" (DDP's logger), "hooks" (module hooks and the timed
    # collectives, any other stack); None when not measured.
    phases_from: str | None = None
    # The work each step does (docs/mfu.md), over the steps whose FLOPs were counted and did not run under the
    # counting itself: FLOPs a step (forward and backward), and the FLOP/s they achieved.  None: not counted.
    flops_per_step: float | None = None
    achieved_flops_per_s: float | None = None
    # torch.compile over the span, from dynamo's own record (gputop.reporter.probes.compile); None: nothing compiled.
    compiles: int | None = None  # frames compiled: first compiles and recompiles
    recompiles: int | None = None  # of which recompiles (a guard failed: a new shape, a new dtype)
    compile_s: float | None = None  # time spent compiling, every compile's
    compile_frac: float | None = None  # compile_s over the span's wall time
    recompile_s: float | None = None  # the recompiles' part of compile_s (a window's in its recompiles' proportion)
    recompile_frac: float | None = None  # recompile_s over the span's wall time
    graph_breaks: int | None = None  # graph breaks so far (dynamo's running count)

    @property
    def other_s(self) -> float | None:
        """Step time outside every measured phase (gputop.combine.PHASES): loader, compute, optimizer, exposed comm."""
        # An optional phase this rank does not measure keeps its time outside the phases.
        parts = {p.seconds: v for p in OWN_PHASES if (v := getattr(self, p.seconds)) is not None or not p.optional}
        parts["exposed_comm_s"] = self.exposed_comm_s
        return other_seconds(self.step_time_mean_s, parts)


def recent(windows: Sequence[Window], span_s: float) -> list[Window]:
    """The windows that ended within ``span_s`` of the newest one."""
    if not windows:
        return []
    cutoff = windows[-1].t1 - span_s
    return [w for w in windows if w.t1 > cutoff]
