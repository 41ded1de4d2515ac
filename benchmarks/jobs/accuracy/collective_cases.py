"""Issue #55's desyncs the backend does not go on through: ranks at one collective number in different calls.

Each job is the convnet's DDP loop with a metric all-reduced after every step (a loss average, as scripts log
one); from ``HANG_STEP`` rank 1's call differs.  gloo then waits for good, so each job is ended as a scheduler
ends a hung one, by SIGTERM once the budget is spent (``unseen_cases._SigtermAt``).  Written, and their first
scores read, before any rule saw them run as corpus jobs (real-job tests had shown the rules the same shapes).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from common import start
from steady_cases import cifar_convnet, images
from torch import nn
from torch.utils.data import DataLoader
from unseen_cases import HANG_STEP, _SigtermAt

import gputop


def _train_with_metric(rank: int, leave: _SigtermAt, *, size_on_rank1: int = 1, skip_on_rank1: bool = False) -> None:
    """The DDP steps, each followed by the loss's all-reduce; from HANG_STEP rank 1 all-reduces ``size_on_rank1``
    floats, or skips it and goes to the barrier a script ends its logging with."""
    model = nn.parallel.DistributedDataParallel(cifar_convnet(), bucket_cap_mb=0.25)
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(images(), batch_size=32, shuffle=True)
    steps = 0
    while True:
        for x, y in gputop.track(loader):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            steps += 1
            late = rank == 1 and steps >= HANG_STEP
            if steps == HANG_STEP:
                leave.hang_begins()
            if late and skip_on_rank1:
                dist.barrier()  # rank 1 thinks logging is over
                continue
            logged = torch.full((size_on_rank1 if late else 1,), loss.item())
            dist.all_reduce(logged)


def desync_metric_size(seconds: float) -> None:
    """From step 10 rank 1 all-reduces its metric with a second value beside it (8 bytes against rank 0's 4)."""
    rank = start()
    _train_with_metric(rank, _SigtermAt(seconds), size_on_rank1=2)


def desync_barrier_meets_metric(seconds: float) -> None:
    """From step 10 rank 1 skips the metric's all-reduce and enters a barrier, which meets rank 0's all-reduce."""
    rank = start()
    _train_with_metric(rank, _SigtermAt(seconds), skip_on_rank1=True)
