"""What every job of the accuracy corpus shares: start, stop together, mark an onset.

Only the plumbing a benchmark needs lives here; each case's model, data and
loop are written out in full in its own module, the way a user writes them.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

ONSET_FILE_ENV = "GPUTOP_BENCH_ONSET_FILE"  # the runner reads the cause's onset (unix time) from here
STOP_CHECK_EVERY = 10  # steps between the ranks' agreement on stopping


def start(threads: int = 1) -> int:
    """One torch thread per rank (torchrun's default), gloo; this rank's number."""
    torch.set_num_threads(threads)
    dist.init_process_group("gloo")
    return dist.get_rank()


class Deadline:
    """Stop every rank at the same step once the wall-clock budget is spent.

    Ranks of a synchronous job can be one step apart when the clock runs out,
    so they agree with a one-element all-reduce every few steps instead of
    each reading its own clock (a rank that stops alone hangs the other).
    """

    def __init__(self, seconds: float) -> None:
        self.started_s = time.monotonic()
        self.end_s = self.started_s + seconds
        self._flag = torch.zeros(1)

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_s

    def reached(self, step: int) -> bool:
        if step % STOP_CHECK_EVERY:
            return False
        self._flag.fill_(float(time.monotonic() >= self.end_s))
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX)
        return bool(self._flag.item())


def mark_onset() -> None:
    """Record when the case's cause switched on, for the time-to-finding figure (rank 0 writes it)."""
    path = os.environ.get(ONSET_FILE_ENV)
    if path and dist.get_rank() == 0:
        with open(path, "w") as handle:
            handle.write(f"{time.time():.3f}\n")


def finish(rank: int, steps: int) -> None:
    print(f"rank {rank}: {steps} steps", flush=True)
    dist.barrier()  # no rank tears gloo down while another is still in a collective
    dist.destroy_process_group()
