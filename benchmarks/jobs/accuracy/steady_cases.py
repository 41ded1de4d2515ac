"""Healthy jobs of different shapes, and steady jobs interrupted by periodic stalls.

Each function is one whole training job as a user would write it; the
expected cause is in the runner's catalogue (benchmarks/diagnosis_accuracy.py).
"""

from __future__ import annotations

import os
import tempfile
import time

import torch
from common import Deadline, finish, start
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import gputop


def cifar_convnet() -> nn.Module:
    """Much compute for few weights (the demo's healthy model): the all-reduce is small next to backward."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 8 * 8, 10),
    )  # fmt: skip


def images(n: int = 2048) -> TensorDataset:
    return TensorDataset(torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,)))


def healthy_convnet(seconds: float) -> None:
    """A CIFAR-sized convnet over epochs of a DistributedSampler (set_epoch each epoch), small buckets."""
    rank = start()
    model = nn.parallel.DistributedDataParallel(cifar_convnet(), bucket_cap_mb=0.25)
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = images()
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=64, sampler=sampler)
    deadline, steps, epoch = Deadline(seconds), 0, 0
    while True:
        sampler.set_epoch(epoch)
        for x, y in gputop.track(loader):
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            steps += 1
            if deadline.reached(steps):
                finish(rank, steps)
                return
        epoch += 1


def healthy_accumulation_manual_marks(seconds: float) -> None:
    """4 micro-batches per optimizer step under no_sync(), one worker, a step marked by hand with gputop.step()."""
    rank = start()
    accumulate = 4
    model = nn.parallel.DistributedDataParallel(cifar_convnet(), bucket_cap_mb=0.25)
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = images()
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data), num_workers=1, persistent_workers=True)
    deadline, steps, micro = Deadline(seconds), 0, 0
    while True:
        for x, y in gputop.track(loader):
            micro += 1
            if micro % accumulate:
                with model.no_sync():
                    (nn.functional.cross_entropy(model(x), y) / accumulate).backward()
                continue
            (nn.functional.cross_entropy(model(x), y) / accumulate).backward()
            opt.step()
            opt.zero_grad()
            gputop.step()
            steps += 1
            if deadline.reached(steps):
                finish(rank, steps)
                return


def stall_checkpoint_rank0(seconds: float) -> None:
    """Rank 0 saves a checkpoint every 5 steps to a slow network disk (torch.save, then 2 s to flush)."""
    rank = start()
    model = nn.parallel.DistributedDataParallel(cifar_convnet(), bucket_cap_mb=0.25)
    gputop.watch(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(images(), batch_size=48, shuffle=True)
    deadline, steps = Deadline(seconds), 0
    with tempfile.TemporaryDirectory(prefix="gputop-bench-ckpt-") as folder:
        while True:
            for x, y in gputop.track(loader):
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                steps += 1
                if rank == 0 and steps % 5 == 0:
                    path = os.path.join(folder, "last.pt")
                    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": steps}, path)
                    time.sleep(2.0)  # a network filesystem's flush: many median steps long on any machine
                if deadline.reached(steps):
                    finish(rank, steps)
                    return


MIN_EVALUATION_STEPS = 40


def stall_periodic_evaluation(seconds: float) -> None:
    """Every 10 steps all ranks evaluate on 1536 held-out images (no_grad, model.eval()): ~8 steps' worth."""
    rank = start()
    model = nn.parallel.DistributedDataParallel(cifar_convnet(), bucket_cap_mb=0.25)
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    train = DataLoader(images(), batch_size=64, shuffle=True)
    held_out = images(1536)
    deadline, steps = Deadline(seconds), 0
    while True:
        for x, y in gputop.track(train):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            steps += 1
            if steps % 10 == 0:
                model.eval()
                with torch.no_grad():
                    batches = DataLoader(held_out, batch_size=128)
                    correct = sum(int((model(vx).argmax(1) == vy).sum()) for vx, vy in batches)
                model.train()
                if rank == 0:
                    print(f"step {steps}: accuracy {correct / len(held_out):.3f}", flush=True)
            # Four evaluations at least, three of them inside a step: on one shared core the budget held
            # 20 steps, one measured evaluation, and a period needs more than one stop to be one.
            if steps >= MIN_EVALUATION_STEPS and deadline.reached(steps):
                finish(rank, steps)
                return
