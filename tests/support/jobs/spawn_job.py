"""mp.spawn instead of torchrun: the reporter must find its rank and flush at exit."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import gputop


def worker(rank: int, world: int, steps: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()  # no rank tears gloo down while another is still in a collective
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = sys.argv[1]
    mp.spawn(worker, args=(2, int(sys.argv[2])), nprocs=2)
