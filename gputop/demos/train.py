"""A small DDP training job that reproduces one cause of low GPU utilization.

Run it under torchrun (``gputop demo`` does this for you)::

    torchrun --nproc_per_node=2 -m gputop.demos.train --scenario slow_loader --seconds 30

gloo on CPU, NCCL when a GPU is there.  The two gputop lines are marked; the
rest is an ordinary training loop, so the numbers it shows are real.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

import gputop


@dataclass(frozen=True)
class Scenario:
    """The knobs that make a run show one cause."""

    about: str
    hidden: int = 512
    layers: int = 3
    batch_size: int = 128
    sample_delay_s: float = 0.0  # per sample, in the dataset: a slow decode or disk
    slow_rank: int | None = None  # only this rank's dataset is slow
    torch_threads: int = 1  # per rank
    num_workers: int = 0
    needs_gpu: bool = False


SCENARIOS: dict[str, Scenario] = {
    "healthy": Scenario("compute dominates each step; input and gradient exchange keep up"),
    "slow_loader": Scenario(
        "every rank waits for input: the dataset takes 0.3 ms a sample on the main process",
        sample_delay_s=0.0003,
    ),
    "straggler": Scenario(
        "rank 1's input is slow, so rank 0 waits for it in every all-reduce",
        sample_delay_s=0.0003,
        slow_rank=1,
    ),
    "comm_bound": Scenario(
        "a wide model with a tiny batch: gradient exchange dwarfs compute",
        hidden=2048,
        layers=4,
        batch_size=4,
    ),
    "small_batch": Scenario(
        "a tiny model and batch: each step is mostly Python and launch overhead",
        hidden=32,
        layers=2,
        batch_size=2,
    ),
    "oversubscribed": Scenario(
        "each rank runs 4 compute threads on a machine with fewer cores than ranks x threads",
        torch_threads=4,
    ),
    "memory_pressure": Scenario(
        "activations fill the GPU: the caching allocator retries and frees",
        hidden=8192,
        layers=8,
        batch_size=4096,
        needs_gpu=True,
    ),
}


class SyntheticData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random samples from a fixed pool, with an optional per-sample delay."""

    def __init__(self, features: int, delay_s: float, size: int = 1 << 20) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(1024, features, generator=generator)
        self.y = torch.randint(0, 10, (1024,), generator=generator)
        self.delay_s = delay_s
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.x[index % 1024], self.y[index % 1024]


def build_model(s: Scenario) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(s.layers - 1):
        layers += [nn.Linear(s.hidden, s.hidden), nn.ReLU()]
    layers.append(nn.Linear(s.hidden, 10))
    return nn.Sequential(*layers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="healthy")
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: run until stopped)")
    parser.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    args = parser.parse_args(argv)
    scenario = SCENARIOS[args.scenario]

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
        build_model(scenario).to(device), device_ids=[local_rank] if use_cuda else None
    )
    gputop.watch(model)  # <- gputop line 1: report this rank's steps, DDP timings, memory, CPU
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    slow = scenario.slow_rank is None or scenario.slow_rank == rank
    data = SyntheticData(scenario.hidden, scenario.sample_delay_s if slow else 0.0)
    loader = DataLoader(data, batch_size=scenario.batch_size, num_workers=scenario.num_workers, shuffle=False)

    deadline = time.monotonic() + args.seconds if args.seconds > 0 else float("inf")
    steps = 0
    stop = torch.zeros(1, device=device)
    for x, y in gputop.track(loader):  # <- gputop line 2: time the waits for input
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        steps += 1
        # Every rank must stop at the same step, or one hangs in its next all-reduce.
        if steps % 10 == 0:
            stop.fill_(float(time.monotonic() >= deadline or (args.steps and steps >= args.steps)))
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item():
                break
        elif args.steps and steps >= args.steps:
            break
    print(f"rank {rank}: {steps} steps", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
