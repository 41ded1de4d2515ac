"""Fixed, deterministic snapshots for the dashboard's tests and screenshots.

Every time is an offset from ``T0``; nothing reads the clock, so snapshot
images do not change from one run to the next.  ``python -m tests.support.tui_fixtures
NAME`` opens the dashboard on one of them (for looking at it in tmux).
"""

from __future__ import annotations

import sys
from dataclasses import replace

import msgspec

from gputop.collect.store import Store
from gputop.model.samples import GpuProcess, GpuReading, GpuSample
from gputop.model.snapshot import Snapshot
from gputop.protocol import CollectiveTimes, Event, Hello, Window
from gputop.sketch import sketch_bucket

T0 = 1_700_000_000.0
WINDOW_S = 0.5
GIB = 1024**3
LISTEN = "/run/user/1000/gputop/gputop.sock"


def hello(run_id: str, rank: int, world_size: int, **facts: object) -> Hello:
    """A rank's hello with realistic defaults for a CUDA DDP job."""
    base: dict[str, object] = dict(
        hostname="node-a",
        pid=4100 + rank,
        name="train.py",
        started_t=T0,
        gputop_version="0.1.0",
        torch_version="2.5.1+cu124",
        backend="nccl",
        device=f"cuda:{rank % 8}",
        device_name="NVIDIA H100 80GB HBM3",
        device_uuid=f"GPU-{rank % 8:08d}-aaaa-bbbb-cccc-000000000000",
        device_total_bytes=80 * GIB,
        loader_batch_size=64,
        loader_num_workers=4,
        loader_pin_memory=True,
        loader_persistent_workers=False,
        loader_prefetch_factor=2,
        autocast=True,
        param_dtype="float32",
        tf32_matmul=False,
        tf32_cudnn=True,
        cudnn_benchmark=False,
        torch_threads=8,
        cpu_count=32,
        model_name="ResNet50",
        ddp=True,
        local_rank=rank % 8,
    )
    base.update(facts)
    return Hello(run_id=run_id, rank=rank, world_size=world_size, **base)  # type: ignore[arg-type]


def window(
    run_id: str,
    rank: int,
    seq: int,
    *,
    step_s: float,
    loader_s: float,
    ddp: bool = True,
    cuda: bool = True,
    batch: int | None = 64,
    exposed_s: float = 0.004,
    cpu_pct: float = 96.0,
    reporter_cpu_s: float | None = None,
    hook_s: float | None = None,
) -> Window:
    """One 0.5 s window; the step's phases add up to ``step_s``."""
    steps = max(int(WINDOW_S / step_s), 1)
    t0 = T0 + seq * WINDOW_S
    wiggle = 1.0 + 0.04 * ((seq * 7 + rank * 3) % 5 - 2)  # deterministic variation for the sparklines
    step = step_s * wiggle
    compute = max(step - loader_s - exposed_s, 0.0)
    return Window(
        run_id=run_id,
        rank=rank,
        seq=seq,
        t0=t0,
        t1=t0 + WINDOW_S,
        steps=steps,
        step_total=(seq + 1) * steps,
        step_time_sum_s=step * steps,
        step_time_p50_s=step,
        step_time_p95_s=step * 1.1,
        step_time_max_s=step * 1.2,
        step_sketch={sketch_bucket(step): steps},
        loader_wait_s=loader_s * steps,
        loader_batches=steps,
        samples=steps * batch if batch else None,
        forward_s=compute * 0.35 if ddp else None,
        backward_s=compute * 0.6 if ddp else None,
        comm_s=exposed_s + 0.010 if ddp else None,
        overlap_s=0.010 if ddp else None,
        mem_allocated_bytes=int((30 + rank % 3) * GIB) if cuda else None,
        mem_reserved_bytes=int(40 * GIB) if cuda else None,
        mem_peak_bytes=int(44 * GIB) if cuda else None,
        mem_total_bytes=80 * GIB if cuda else None,
        alloc_retries=0 if cuda else None,
        ooms=0 if cuda else None,
        cpu_pct=cpu_pct,
        rss_bytes=int(6.5 * GIB),
        threads=24,
        workers=4,
        workers_cpu_pct=180.0,
        reporter_cpu_s=reporter_cpu_s,
        hook_s=hook_s,
        sent_bytes=None if reporter_cpu_s is None else 1500,
    )


def gpu_reading(index: int, *, util: float, mem_gib: float, processes: tuple[GpuProcess, ...] = ()) -> GpuReading:
    return GpuReading(
        index=index,
        uuid=f"GPU-{index:08d}-aaaa-bbbb-cccc-000000000000",
        name="NVIDIA H100 80GB HBM3",
        util_pct=util,
        mem_util_pct=util * 0.6,
        mem_used_bytes=int(mem_gib * GIB),
        mem_total_bytes=80 * GIB,
        power_w=120 + util * 5.5,
        power_limit_w=700.0,
        temp_c=40 + util * 0.3,
        processes=processes,
    )


def _gpu_samples(store: Store, n_gpus: int, n: int, extra: dict[int, tuple[GpuProcess, ...]] | None = None) -> None:
    for i in range(n):
        store.add_gpu(
            GpuSample(
                t=T0 + i,
                gpus=tuple(
                    gpu_reading(
                        g,
                        util=float(60 + (g * 7 + i * 3) % 35),
                        mem_gib=31.0 + g % 3,
                        processes=(
                            GpuProcess(pid=4100 + g, used_bytes=int((31 + g % 3) * GIB), name="python"),
                            *(extra or {}).get(g, ()),
                        ),
                    )
                    for g in range(n_gpus)
                ),
                driver_version="550.54.15",
            )
        )


def self_accounting(*, n_windows: int = 20) -> Snapshot:
    """One CPU rank whose reporter accounts for itself: 1 ms of its thread and 0.1 ms of hooks per window."""
    store = Store(listen=LISTEN)
    store.ingest(hello("run-cost", 0, 1, device="cpu", device_uuid=None, backend=None), T0)
    for seq in range(n_windows):
        w = window("run-cost", 0, seq, step_s=0.050, loader_s=0.002, ddp=False, cuda=False, cpu_pct=100.0,
                   reporter_cpu_s=0.001, hook_s=0.0001)  # fmt: skip
        store.ingest(w, T0 + (seq + 1) * WINDOW_S)
    return store.snapshot(T0 + n_windows * WINDOW_S)


def two_ranks(*, n_windows: int = 40) -> Snapshot:
    """A healthy-ish 2-rank CUDA DDP run where rank 1 waits for data."""
    store = Store(listen=LISTEN)
    for rank in range(2):
        store.ingest(hello("run-a", rank, 2), T0)
    for seq in range(n_windows):
        now = T0 + (seq + 1) * WINDOW_S
        store.ingest(window("run-a", 0, seq, step_s=0.050, loader_s=0.002, exposed_s=0.012), now)
        store.ingest(window("run-a", 1, seq, step_s=0.050, loader_s=0.021, exposed_s=0.001), now)
    store.ingest(
        Event(run_id="run-a", rank=1, t=T0 + 3.0, kind="note", message="DataLoader workers: 4"),
        T0 + n_windows * WINDOW_S,
    )
    _gpu_samples(store, 2, n_windows // 2)
    return store.snapshot(T0 + n_windows * WINDOW_S)


def fsdp2_ranks(
    *, n_windows: int = 30, gather_exposed_s: float = 0.021, last_gather_exposed_s: float | None = None
) -> Snapshot:
    """A 2-rank FSDP2 run on the CPU: phases from hooks, all-gathers and reduce-scatters on the mesh's 'dp'.

    Both ranks wait ``gather_exposed_s`` a step in the all-gathers, or rank 1 reaches them last and waits
    ``last_gather_exposed_s``."""
    last_gather_exposed_s = gather_exposed_s if last_gather_exposed_s is None else last_gather_exposed_s
    store = Store(listen=LISTEN)
    for rank in range(2):
        store.ingest(hello("run-f", rank, 2, backend="gloo", device="cpu"), T0)
    for seq in range(n_windows):
        now = T0 + (seq + 1) * WINDOW_S
        for rank in range(2):
            w = window("run-f", rank, seq, step_s=0.100, loader_s=0.001, exposed_s=0.030, cuda=False)
            n = w.steps
            collectives = (
                CollectiveTimes(
                    "all_gather",
                    "dp",
                    7 * n,
                    7 * n * 95_000,
                    0.024 * n,
                    (gather_exposed_s if rank == 0 else last_gather_exposed_s) * n,
                    2,
                ),
                CollectiveTimes("reduce_scatter", "dp", 4 * n, 4 * n * 183_000, 0.01 * n, 0.009 * n, 2),
            )
            store.ingest(msgspec.structs.replace(w, collectives=collectives, phases_from="hooks"), now)
    return store.snapshot(T0 + n_windows * WINDOW_S)


def big_run(*, n_windows: int = 20) -> Snapshot:
    """64 ranks on 8 nodes; this node's 8 GPUs; rank 5 straggles; a foreign process on GPU 3."""
    store = Store(listen=LISTEN)
    for rank in range(64):
        node, local = divmod(rank, 8)
        facts = dict(hostname=f"node-{node}", name="llm_pretrain.py", device=f"cuda:{local}", local_rank=local)
        # Only node-0 is this machine: the other nodes' GPUs are not in its NVML readings.
        store.ingest(hello("run-big", rank, 64, device_uuid=f"GPU-{local:08d}-aaaa-bbbb-cccc-{node:012d}", **facts), T0)
    for seq in range(n_windows):
        now = T0 + (seq + 1) * WINDOW_S
        for rank in range(64):
            slow = rank == 5
            store.ingest(
                window(
                    "run-big",
                    rank,
                    seq,
                    step_s=0.120,
                    loader_s=0.030 if slow else 0.0031,  # 2.6%: 2.5% rounds either way by float noise
                    exposed_s=0.002 if slow else 0.030,
                ),
                now,
            )
    intruder: dict[int, tuple[GpuProcess, ...]] = {3: (GpuProcess(pid=9999, used_bytes=2 * GIB, name="jupyter"),)}
    _gpu_samples(store, 8, n_windows // 2, intruder)
    return store.snapshot(T0 + n_windows * WINDOW_S)


def eight_ranks(*, n_windows: int = 40) -> Snapshot:
    """8 ranks on 2 hosts of 4 GPUs (this machine is node-a); rank 6 on node-b waits for data."""
    store = Store(listen=LISTEN)
    for rank in range(8):
        node, local = divmod(rank, 4)
        host = "node-a" if node == 0 else "node-b"
        uuid = f"GPU-{local:08d}-aaaa-bbbb-cccc-{node:012d}"
        facts = dict(hostname=host, device=f"cuda:{local}", local_rank=local, device_uuid=uuid)
        store.ingest(hello("run-8", rank, 8, **facts), T0)
    for seq in range(n_windows):
        now = T0 + (seq + 1) * WINDOW_S
        for rank in range(8):
            slow = rank == 6
            w = window(
                "run-8",
                rank,
                seq,
                step_s=0.080,
                # Off the 2.5% and 17.5% shares that round either way by float noise (Python 3.12's sum() is exact).
                loader_s=0.024 if slow else 0.0021,
                exposed_s=0.0019 if slow else 0.018,
            )
            store.ingest(w, now)
    _gpu_samples(store, 4, n_windows // 2)
    return store.snapshot(T0 + n_windows * WINDOW_S)


def remote_gpus(*, n_windows: int = 40) -> Snapshot:
    """8 ranks on node-a and node-b, 4 GPUs each read by each node's sampler; the dashboard's host has no GPU."""
    store = Store(listen=LISTEN)
    for rank in range(8):
        node, local = divmod(rank, 4)
        uuid = f"GPU-{local:08d}-aaaa-bbbb-cccc-{node:012d}"
        facts = dict(hostname=f"node-{'ab'[node]}", device=f"cuda:{local}", local_rank=local, device_uuid=uuid)
        store.ingest(hello("run-8", rank, 8, **facts), T0)
    for seq in range(n_windows):
        now = T0 + (seq + 1) * WINDOW_S
        for rank in range(8):
            store.ingest(window("run-8", rank, seq, step_s=0.080, loader_s=0.002, exposed_s=0.018), now)
    store.add_gpu(GpuSample(t=T0, unavailable="NVML library not found (libnvidia-ml.so.1)"))
    foreign = (GpuProcess(pid=9999, used_bytes=2 * GIB, name="jupyter"),)
    for i in range(int(n_windows * WINDOW_S)):
        for node in range(2):
            gpus = tuple(
                replace(
                    gpu_reading(
                        g,
                        util=float(20 + 20 * g + 5 * node),
                        mem_gib=31.0,
                        processes=foreign if (node, g) == (1, 2) else (),
                    ),
                    uuid=f"GPU-{g:08d}-aaaa-bbbb-cccc-{node:012d}",
                )
                for g in range(4)
            )
            store.add_node_gpu(GpuSample(t=T0 + i + 1, gpus=gpus, hostname=f"node-{'ab'[node]}"))
    return store.snapshot(T0 + n_windows * WINDOW_S)


def no_gpu(*, n_windows: int = 30) -> Snapshot:
    """A 2-rank CPU gloo run on a machine without NVML."""
    store = Store(listen=LISTEN)
    for rank in range(2):
        cpu_facts = dict(
            device="cpu",
            device_name=None,
            device_uuid=None,
            device_total_bytes=None,
            backend="gloo",
            autocast=False,
            tf32_matmul=None,
            tf32_cudnn=None,
            cudnn_benchmark=None,
            torch_version="2.5.1+cpu",
            hostname="laptop",
            name="demo_ddp.py",
        )
        store.ingest(hello("run-cpu", rank, 2, **cpu_facts), T0)
    for seq in range(n_windows):
        now = T0 + (seq + 1) * WINDOW_S
        for rank in range(2):
            store.ingest(window("run-cpu", rank, seq, step_s=0.014, loader_s=0.001, cuda=False, cpu_pct=99.0), now)
    store.add_gpu(GpuSample(t=T0, unavailable="NVML library not found (libnvidia-ml.so.1)"))
    return store.snapshot(T0 + n_windows * WINDOW_S)


def empty() -> Snapshot:
    """Nothing reports yet."""
    store = Store(listen=LISTEN)
    _gpu_samples(store, 2, 1)
    return store.snapshot(T0)


def lost_rank() -> Snapshot:
    """The 2-rank run, 8 s later, with rank 1 silent since then."""
    store = Store(listen=LISTEN)
    for rank in range(2):
        store.ingest(hello("run-a", rank, 2), T0)
    for seq in range(40):
        now = T0 + (seq + 1) * WINDOW_S
        store.ingest(window("run-a", 0, seq, step_s=0.050, loader_s=0.002), now)
        if seq < 24:
            store.ingest(window("run-a", 1, seq, step_s=0.050, loader_s=0.021), now)
    _gpu_samples(store, 2, 20)
    return store.snapshot(T0 + 40 * WINDOW_S)


def two_runs() -> Snapshot:
    """Two jobs on one machine: a 2-rank run and a 1-rank run without DDP."""
    store = Store(listen=LISTEN)
    for rank in range(2):
        store.ingest(hello("run-a", rank, 2), T0)
    store.ingest(hello("run-b", 0, 1, name="finetune.py", ddp=False, backend=None, pid=5200), T0 + 1)
    for seq in range(20):
        now = T0 + (seq + 1) * WINDOW_S
        for rank in range(2):
            store.ingest(window("run-a", rank, seq, step_s=0.050, loader_s=0.002), now)
        store.ingest(window("run-b", 0, seq, step_s=0.080, loader_s=0.010, ddp=False, batch=None), now)
    _gpu_samples(store, 2, 10)
    return store.snapshot(T0 + 20 * WINDOW_S)


FIXTURES = {
    "two_ranks": two_ranks,
    "eight_ranks": eight_ranks,
    "big_run": big_run,
    "no_gpu": no_gpu,
    "empty": empty,
    "lost_rank": lost_rank,
    "two_runs": two_runs,
}


if __name__ == "__main__":  # pragma: no cover - a manual look, not a test
    from gputop.model.source import FixedSource
    from gputop.tui.app import run_dashboard

    name = sys.argv[1] if len(sys.argv) > 1 else "two_ranks"
    sys.exit(run_dashboard(FixedSource(FIXTURES[name](), description=f"fixed data: {name}")))
