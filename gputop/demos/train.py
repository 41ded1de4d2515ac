"""A small DDP training job that reproduces one cause of low GPU utilization.

Run it under torchrun (``gputop demo`` does this for you)::

    torchrun --nproc_per_node=2 -m gputop.demos.train --scenario slow_loader --seconds 30

gloo on CPU, NCCL when a GPU is there.  The two gputop lines are marked; the
rest is an ordinary training loop, so the numbers it shows are real.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Any

# Huge pages for PyTorch's CPU tensors, read once at the first allocation, so before torch.
# Without them, two ranks doing the same work on this 2-vCPU VM computed up to 10% apart
# (8 concurrent pairs of the healthy step: 1.5-10%), by where their pages happened to
# land; with them, 1-5% and every step ~10% faster.  Evenly matched ranks are what a
# healthy run is, and the demo should not show a straggler that page placement made.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

import gputop
from gputop.demos.scenarios import SCENARIOS, Scenario, fitted, usable_cores
from gputop.demos.teardown import LEFT_WITH_THE_DEMO, exit_without_teardown, leave_with_the_demo


# misc: a subclass of Any where torch is not installed (`make check`); unused-ignore: where it is.
class SyntheticData(Dataset[tuple[torch.Tensor, torch.Tensor]]):  # type: ignore[misc, unused-ignore]
    """Random samples from a fixed pool, fetched a batch at a time, with an optional delay per batch.

    ``__getitems__`` lets the DataLoader fetch a whole batch in one call, so
    input costs what the scenario says and not Python's per-sample overhead.
    """

    def __init__(self, shape: tuple[int, ...], batch_delay_s: float, size: int = 1 << 24) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(4096, *shape, generator=generator)
        self.y = torch.randint(0, 10, (4096,), generator=generator)
        self.batch_delay_s = batch_delay_s
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index % 4096], self.y[index % 4096]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.batch_delay_s:
            time.sleep(self.batch_delay_s)
        rows = torch.tensor(indices) % 4096
        return self.x[rows], self.y[rows]


def keep_batch(batch: Any) -> Any:
    """The collate function: ``__getitems__`` already returns a batch."""
    return batch


def work_for(seconds: float) -> None:
    """Python work on the training thread (a metric over the epoch's scores), this long."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sorted(range(2000), key=lambda k: (k * 7919) % 2000)


IMAGE = (3, 32, 32)  # the convolutional model's input: CIFAR-sized images


def build_model(s: Scenario) -> nn.Module:
    if s.model == "cnn":
        # Convolutions reuse each weight at every pixel: much compute for few
        # parameters, so gradient exchange is small next to backward.
        return nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 8 * 8, 10),
        )
    layers: list[nn.Module] = []
    for _ in range(s.layers - 1):
        layers += [nn.Linear(s.hidden, s.hidden), nn.ReLU()]
    layers.append(nn.Linear(s.hidden, 10))
    return nn.Sequential(*layers)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="healthy")
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: run until stopped)")
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not leave_with_the_demo():
        return LEFT_WITH_THE_DEMO
    # Sized to the machine as `gputop demo` said it would be: the same function, the same inputs.
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    scenario = fitted(SCENARIOS[args.scenario], cores=usable_cores(), nproc=ranks_here)

    use_cuda = torch.cuda.is_available()
    if scenario.needs_gpu and not use_cuda:
        print(f"gputop demo: scenario {args.scenario} needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    torch.set_num_threads(scenario.torch_threads)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    model = nn.parallel.DistributedDataParallel(
        build_model(scenario).to(device),
        device_ids=[local_rank] if use_cuda else None,
        bucket_cap_mb=scenario.bucket_cap_mb,
    )
    gputop.watch(model)  # <- gputop line 1: report this rank's steps, DDP timings, memory, CPU
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    slow = scenario.slow_rank is None or scenario.slow_rank == rank
    shape = IMAGE if scenario.model == "cnn" else (scenario.hidden,)
    data = SyntheticData(shape, scenario.batch_delay_s if slow else 0.0)
    loader = DataLoader(data, batch_size=scenario.batch_size, num_workers=scenario.num_workers, collate_fn=keep_batch)

    started = time.monotonic()
    deadline = started + args.seconds if args.seconds > 0 else float("inf")
    steps = 0
    stop = torch.zeros(1, device=device)
    for x, y in gputop.track(loader):  # <- gputop line 2: time the waits for input
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if scenario.rotating_extra_s and random.Random(steps).randrange(dist.get_world_size()) == rank:
            work_for(scenario.rotating_extra_s)  # this step's drawn rank: the others wait for it
        steps += 1
        # Every rank must stop at the same step, or one hangs in its next all-reduce.
        if steps % 10 == 0:
            stop.fill_(float(time.monotonic() >= deadline or (args.steps and steps >= args.steps)))
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item():
                break
        elif args.steps and steps >= args.steps:
            break
    print(f"rank {rank}: {steps} steps in {time.monotonic() - started:.3f} s", flush=True)
    dist.barrier()  # no rank tears gloo down while another is still in a collective
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_without_teardown(main())
