"""Snapshots for the diagnosis tests, built from a few numbers per rank.

A ``RankSpec`` says what a rank's steps look like as shares of the step
(loader wait, forward, backward, comm, overlap); ``make_snapshot`` turns specs
into hello and window messages fed through a real ``Store``, so the rules see
exactly what they would see live.  A share given as None is sent as not
measured (N/A), never as zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gputop.collect.store import Store
from gputop.diagnose import Finding, diagnose
from gputop.diagnose.details import StragglerDetails
from gputop.model.figures import SPAN_S, summarize
from gputop.model.samples import BusyProcess, GpuProcess, GpuReading, GpuSample, HostSample, ProcessReading
from gputop.model.snapshot import Snapshot
from gputop.protocol import Hello, Window
from gputop.sketch import sketch_bucket

GIB = 1 << 30
WINDOW_S = 0.5
T0 = 1_000_000.0


@dataclass
class RankSpec:
    """One rank's steady state, as shares of wall step time."""

    rank: int = 0
    step_s: float = 0.1
    loader_frac: float | None = 0.01  # None: the loader is not tracked
    forward_frac: float | None = 0.3  # None: no DDP timings
    backward_frac: float | None = 0.5
    comm_frac: float | None = 0.1
    comm_swing_frac: float = 0.0  # comm alternates +- this share window to window (a noisy shared machine)
    overlap_frac: float | None = 0.08
    cpu_pct: float | None = 80.0
    workers: int | None = None
    workers_cpu_pct: float | None = None
    # Of the time ready to run, the share spent waiting for a CPU (None: no schedstat):
    cpu_starved_frac: float | None = None  # the rank's threads
    workers_starved_frac: float | None = None  # its workers'
    mem_peak_frac: float | None = None  # of mem_total_bytes; None: no CUDA memory figures
    mem_total_bytes: int = 80 * GIB
    mem_reserved_over_allocated: float = 1.1
    alloc_retries_per_window: int = 0
    ooms_per_window: int = 0
    gpu_step_frac: float | None = None  # GPU step time as a share of wall step time
    stall_s: float = 0.0  # > 0: each window also holds steps this long (a GC pause, a descheduled rank)
    stalls_per_window: int = 1  # how many
    # When the rank was ready for the exchange, as a share of the step (None: an older reporter, not sent),
    # plus ``ready_extra_frac[n % len]`` in step n: (0.5,) late in every step, (0.5, 0.0) in every other one.
    ready_frac: float | None = None
    ready_extra_frac: tuple[float, ...] = (0.0,)
    # With readiness: each step's forward sent beside it, a tenth of the step plus that step's extra, and its
    # input's elements, this many per share of a step of forward (0: none sent, an older reporter's windows).
    input_numel_per_frac: int = 0
    # The FLOP/s its steps achieve (their counted FLOPs over their time; None: not counted).  MFU reads it against
    # the hello's peak: ``cpu_peak_flops`` on a CPU, the GPU's datasheet for ``flops_mix`` on CUDA.
    flops_per_s: float | None = None
    hello: dict[str, Any] = field(default_factory=dict)  # Hello field overrides
    status: str = "live"  # "lost": the rank stops reporting long before the snapshot


def cuda_hello(index: int = 0, **overrides: Any) -> dict[str, Any]:
    """Hello fields of a rank on an A100 (its device UUID matches ``gpu_reading(index)``)."""
    facts: dict[str, Any] = {
        "device": f"cuda:{index}",
        "device_name": "NVIDIA A100-SXM4-80GB",
        "device_uuid": f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        "device_total_bytes": 80 * GIB,
        "backend": "nccl",
    }
    facts.update(overrides)
    return facts


def gpu_reading(index: int = 0, *, util_pct: float | None = 90.0, processes: Sequence[GpuProcess] = ()) -> GpuReading:
    return GpuReading(
        index=index,
        uuid=f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        name="NVIDIA A100-SXM4-80GB",
        util_pct=util_pct,
        mem_total_bytes=80 * GIB,
        processes=tuple(processes),
    )


def rank_windows(spec: RankSpec, run_id: str, *, seconds: float, t_end: float) -> list[Window]:
    n = max(round(seconds / WINDOW_S), 1)
    steps = max(round(WINDOW_S / spec.step_s), 1)
    step = spec.step_s
    sketch = {sketch_bucket(step): steps}
    stalls: tuple[tuple[float, float], ...] = ()
    if spec.stall_s:
        sketch[sketch_bucket(spec.stall_s)] = spec.stalls_per_window
        stalls = ((spec.stall_s, 0.0),) * spec.stalls_per_window
    out = []
    for i in range(n):
        t1 = t_end - (n - 1 - i) * WINDOW_S
        numbers = range(i * (steps + len(stalls)) + 1, (i + 1) * (steps + len(stalls)) + 1)
        ready: tuple[float, ...] = ()
        if spec.ready_frac is not None:
            extra = spec.ready_extra_frac
            # A jitter of up to ±0.5% of the step, the same in every run of the tests.
            ready = tuple(
                step * (spec.ready_frac + extra[k % len(extra)] + ((k * 7919) % 11 - 5) / 1000) for k in numbers
            )
        forwards: tuple[float, ...] = ()
        if ready and spec.input_numel_per_frac:
            forwards = tuple(step * (0.1 + spec.ready_extra_frac[k % len(spec.ready_extra_frac)]) for k in numbers)
        work: dict[str, Any] = {}
        if spec.flops_per_s is not None:
            work = {"flops_sum": spec.flops_per_s * steps * step, "flops_time_s": steps * step, "flops_steps": steps}
        peak = None
        if spec.mem_peak_frac is not None:
            peak = int(spec.mem_peak_frac * spec.mem_total_bytes)
        allocated = int(0.5 * peak) if peak is not None else None
        out.append(
            Window(
                run_id=run_id,
                rank=spec.rank,
                seq=i,
                t0=t1 - WINDOW_S,
                t1=t1,
                steps=steps + len(stalls),
                step_total=(steps + len(stalls)) * (i + 1),
                step_time_sum_s=steps * step + spec.stall_s * len(stalls),
                step_time_p50_s=step,
                step_time_p95_s=step,
                step_time_max_s=max(step, spec.stall_s),
                step_sketch=sketch,
                slow_steps=stalls,
                ready_step_numbers=tuple(numbers) if ready else (),
                ready_s=ready,
                ready_forward_s=forwards,
                ready_input_numel=tuple(round(spec.input_numel_per_frac * f / step) for f in forwards),
                gpu_step_time_p50_s=spec.gpu_step_frac * step if spec.gpu_step_frac is not None else None,
                loader_wait_s=(spec.loader_frac or 0.0) * steps * step,
                loader_batches=steps if spec.loader_frac is not None else 0,
                forward_s=_per_step(spec.forward_frac, step),
                backward_s=_per_step(spec.backward_frac, step),
                comm_s=_per_step(
                    None if spec.comm_frac is None else spec.comm_frac + spec.comm_swing_frac * (-1) ** i, step
                ),
                overlap_s=_per_step(spec.overlap_frac, step) if spec.comm_frac is not None else None,
                mem_allocated_bytes=allocated,
                mem_reserved_bytes=int(allocated * spec.mem_reserved_over_allocated) if allocated else None,
                mem_peak_bytes=peak,
                mem_total_bytes=spec.mem_total_bytes if peak is not None else None,
                alloc_retries=spec.alloc_retries_per_window * i if peak is not None else None,
                ooms=spec.ooms_per_window * i if peak is not None else None,
                cpu_pct=spec.cpu_pct,
                workers=spec.workers,
                workers_cpu_pct=spec.workers_cpu_pct,
                main_cpu_wait_s=_wait_s(spec.cpu_starved_frac, spec.cpu_pct),
                cpu_wait_s=_wait_s(spec.cpu_starved_frac, spec.cpu_pct),
                workers_cpu_wait_s=_wait_s(spec.workers_starved_frac, spec.workers_cpu_pct),
                **work,
            )
        )
    return out


def _wait_s(starved_frac: float | None, cpu_pct: float | None) -> float | None:
    """The run-queue wait in one window that makes ``starved_frac`` of (wait + CPU time)."""
    if starved_frac is None or cpu_pct is None:
        return None
    cpu_s = cpu_pct / 100.0 * WINDOW_S
    return cpu_s * starved_frac / (1.0 - starved_frac)


def _per_step(frac: float | None, step_s: float) -> float | None:
    return None if frac is None else frac * step_s


def make_snapshot(
    specs: Sequence[RankSpec],
    *,
    run_id: str = "run",
    more_runs: dict[str, Sequence[RankSpec]] | None = None,
    seconds: float = 10.0,
    hello: dict[str, Any] | None = None,
    gpus: Sequence[GpuReading] | None = None,
    gpu_unavailable: str | None = None,
    host: HostSample | None = None,
    age_s: float = 60.0,
) -> Snapshot:
    """A snapshot at the end of ``seconds`` of steady state for each run's ranks.

    ``hello`` overrides Hello fields for every rank (a spec's own ``hello`` wins).
    ``age_s``: how long before the snapshot the ranks said hello (at least
    ``seconds``); by default a run past its warm-up.
    """
    store = Store()
    t_end = T0 + seconds
    runs = {run_id: specs, **(more_runs or {})}
    for rid, rank_specs in runs.items():
        for spec in rank_specs:
            facts: dict[str, Any] = {
                "world_size": len(rank_specs),
                "hostname": "node0",
                "pid": 1000 + 10 * len(rid) + spec.rank,
                "device": "cpu",
                "backend": "gloo" if len(rank_specs) > 1 else None,
                "loader_batch_size": 64,
                "loader_num_workers": 0,
                "torch_threads": 1,
                "cpu_count": 16,
            }
            facts.update(hello or {})
            facts.update(spec.hello)
            store.ingest(Hello(run_id=rid, rank=spec.rank, **facts), t_end - max(age_s, seconds))
            # A lost rank went silent 6 s before the snapshot: past the store's 5 s LOST_AFTER_S.
            end = t_end - 6.0 if spec.status == "lost" else t_end
            for window in rank_windows(spec, rid, seconds=seconds if spec.status != "lost" else seconds / 2, t_end=end):
                store.ingest(window, window.t1)
    if gpus is not None or gpu_unavailable is not None:
        for k in range(int(seconds)):
            store.add_gpu(GpuSample(t=T0 + k + 1, gpus=tuple(gpus or ()), unavailable=gpu_unavailable))
    if host is not None:
        store.add_host(host)
    return store.snapshot(t_end)


def host_sample(
    pids: Sequence[int],
    *,
    cpu_count: int = 16,
    load_1m: float = 1.0,
    cpu_pct: float = 50.0,
    busy: Sequence[BusyProcess] = (),
    gputop_pid: int | None = None,
) -> HostSample:
    return HostSample(
        t=T0 + 10,
        cpu_pct=cpu_pct,
        load_1m=load_1m,
        cpu_count=cpu_count,
        processes=tuple(ProcessReading(pid=pid) for pid in pids),
        busy=tuple(busy),
        gputop_pid=gputop_pid,
    )


def two_ranks(**shared: Any) -> list[RankSpec]:
    """Ranks 0 and 1 with the same figures."""
    return [RankSpec(rank=0, **shared), RankSpec(rank=1, **shared)]


# Rank 1 waits 40% of each step for data; rank 0 waits for it in the all-reduce: a warn straggler.
SLOW_LOADER = [
    RankSpec(rank=0, loader_frac=0.01, forward_frac=0.2, backward_frac=0.3, comm_frac=0.45, overlap_frac=0.05),
    RankSpec(rank=1, loader_frac=0.40, forward_frac=0.2, backward_frac=0.3, comm_frac=0.07, overlap_frac=0.05),
]


# Two ranks on two GPUs; rank 1 waits 40% of each 100-ms step for data, rank 0 waits for it.
CUDA_STRAGGLER = [
    RankSpec(rank=0, hello=cuda_hello(0), comm_frac=0.5, overlap_frac=0.05),
    RankSpec(rank=1, hello=cuda_hello(1), loader_frac=0.4, comm_frac=0.05, overlap_frac=0.04),
]


def findings_of(snapshot: Snapshot, *, span_s: float = SPAN_S) -> list[Finding]:
    """What the rules find in the snapshot's figures over a span (by default the dashboard's)."""
    return diagnose(summarize(snapshot, span_s=span_s))


def straggler_of(finding: Finding) -> StragglerDetails:
    """A straggler finding's own details: its slow phase, whether it rotates, which rank was the slowest."""
    assert isinstance(finding.details, StragglerDetails), finding
    return finding.details
