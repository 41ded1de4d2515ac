"""Stacks messages made by hand, and a hung run to add them to: the frames tests and the Flight Recorder's."""

from __future__ import annotations

import dataclasses

from gputop.collect.store import Store
from gputop.model.snapshot import Snapshot
from gputop.protocol import Hello, SampledFrame, StackFrame, Stacks, Window

T0 = 1_000_000.0
LOCK = StackFrame("after_step", "train.py", 102, "wait_for_lock")
METRIC = SampledFrame("after_step", "train.py", 57, "compute_metrics", 38)


def stacks(rank: int, t: float, *, top: tuple[SampledFrame, ...] = (), now: StackFrame | None = LOCK,
           samples: int = 100, run_id: str = "run") -> Stacks:  # fmt: skip
    return Stacks(run_id=run_id, rank=rank, t=t, period_s=1.0, interval_s=0.05, samples=samples, top=top, now=now)


def with_stacks(snapshot: Snapshot, by_rank: dict[int, list[Stacks]]) -> Snapshot:
    """The snapshot with these stacks messages added to its ranks (as a reporter that samples would send them)."""
    runs = tuple(
        dataclasses.replace(
            run,
            ranks=tuple(dataclasses.replace(r, stacks=tuple(by_rank.get(r.rank, ()))) for r in run.ranks),
        )
        for run in snapshot.runs
    )
    return dataclasses.replace(snapshot, runs=runs)


def hung_run(*, ddp: bool = True, ranks: int = 2) -> Snapshot:
    """Ranks 0 and 1 (or ``ranks`` of them) stepped for 20 s, then none for 8 s; their reporters kept sending."""
    store = Store()
    for rank in range(ranks):
        store.ingest(Hello(run_id="run", rank=rank, world_size=ranks, pid=100 + rank, ddp=ddp), T0)
    t, seq, total = T0, 0, 0
    while t < T0 + 28:
        steps = 10 if t < T0 + 20 else 0
        total, seq = total + steps, seq + 1
        for rank in range(ranks):
            window = Window(run_id="run", rank=rank, seq=seq, t0=t, t1=t + 0.5, steps=steps, step_total=total,
                            step_time_sum_s=steps * 0.05, step_time_p50_s=0.05 if steps else None,
                            step_time_max_s=0.05 if steps else None, cpu_pct=2.0)  # fmt: skip
            store.ingest(window, t + 0.5)
        t += 0.5
    return store.snapshot(t)
