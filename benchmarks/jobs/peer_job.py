"""The job `benchmarks/vs_peers.py` runs under each monitor: 2-rank gloo DDP, a small MLP, ~10 ms steps.

``--observer none|gputop|traceml`` adds that monitor's own lines and nothing
else; rank 0 prints ``loop_ms_per_step X`` measured around the training loop
only (after torch's import and the process group's start).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Fixed random samples, fetched a batch at a time: input costs next to nothing."""

    def __init__(self, width: int) -> None:
        self.x = torch.randn(4096, width)
        self.y = torch.randint(0, 10, (4096,))

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index % 4096], self.y[index % 4096]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.tensor(indices) % 4096
        return self.x[rows], self.y[rows]


def keep_batch(batch: Any) -> Any:
    return batch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--observer", choices=("none", "gputop", "traceml"), default="none")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(),
                      nn.Linear(args.width, 10))
    )  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader: Any = DataLoader(Samples(args.width), batch_size=args.batch, collate_fn=keep_batch)

    step_context: Any = contextlib.nullcontext
    if args.observer == "gputop":
        import gputop

        gputop.watch(model)
        loader = gputop.track(loader)
    elif args.observer == "traceml":
        import traceml_ai as traceml

        traceml.init(mode="auto")

        @contextlib.contextmanager
        def step_context() -> Iterator[None]:
            with traceml.trace_step(model):
                yield

    steps = 0
    started = time.perf_counter()
    for x, y in loader:
        with step_context():
            optimizer.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        steps += 1
        if steps == args.steps:
            break
    elapsed = time.perf_counter() - started
    if dist.get_rank() == 0:
        print(f"loop_ms_per_step {elapsed / steps * 1000:.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # gloo aborts now and then in the interpreter's teardown after a finished job (gputop/demos/teardown.py):
    # one aborted rank ended this benchmark's first 6-round attempt.  Written out here, not imported:
    # the TraceML modes run this file from a venv without gputop.
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    os._exit(0)
