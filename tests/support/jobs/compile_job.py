"""A compiled DDP job for the integration tests: ``torch.compile(model, dynamic=False)``, as people write it for speed.

``--shapes N`` feeds N sequence lengths, the next one every ``--every`` steps
and round again (a text model fed unpadded batches): with ``dynamic=False``
dynamo compiles the model once per length, so the job recompiles N - 1 times.
``--shapes 1`` is the steady job: one compile, then the same graph every step.

``--compile`` says where the compile stands against ``gputop.watch``: ``inner`` compiles the model inside DDP
(the recordings'), ``after`` compiles the watched DDP model (the README's two lines, then ``torch.compile``),
``before`` watches the compiled DDP model, ``inplace`` calls ``model.compile()`` on the watched one.  Each rank
prints what dynamo compiled of gputop's own code (nothing, ever) and how many forwards gputop saw.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import gputop
from gputop.demos.teardown import exit_without_teardown

SEQUENCE_LENGTHS = (16, 24, 40, 64, 96, 128)


class TinyEncoder(nn.Module):
    """Tokens of 16 features in, one of 10 classes out: small, so compiling it dominates, as in a real run's start."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.proj = nn.Linear(16, hidden)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.proj(x)).mean(dim=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--shapes", type=int, default=4, help="sequence lengths fed in turn; 1: a steady job")
    parser.add_argument("--every", type=int, default=5, help="steps of one length before the next")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--compile", choices=("inner", "after", "before", "inplace"), default="inner")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model: Any = TinyEncoder(args.hidden)
    if args.compile == "inner":
        model = nn.parallel.DistributedDataParallel(torch.compile(model, dynamic=False))
        reporter = gputop.watch(model)
    elif args.compile == "before":
        model = torch.compile(nn.parallel.DistributedDataParallel(model), dynamic=False)
        reporter = gputop.watch(model)
    else:
        model = nn.parallel.DistributedDataParallel(model)
        reporter = gputop.watch(model)
        if args.compile == "after":
            model = torch.compile(model, dynamic=False)
        else:
            model.compile(dynamic=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    lengths = SEQUENCE_LENGTHS[: max(args.shapes, 1)]
    for step in range(args.steps):
        length = lengths[(step // args.every) % len(lengths)]
        x = torch.randn(args.batch_size, length, 16)
        y = torch.randint(0, 10, (args.batch_size,))
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    entries = torch._dynamo.utils._compilation_metrics
    ours = [e.co_name for e in entries if "gputop" in str(getattr(e, "co_filename", ""))]
    recompiles = sum(1 for e in entries if getattr(e, "recompile_reason", None))
    forwards = reporter.side.train_forwards if reporter is not None else None
    print(f"rank {dist.get_rank()} steps {args.steps} forwards {forwards} recompiles {recompiles} gputop {ours}",
          flush=True)  # fmt: skip
    dist.barrier()  # no rank tears gloo down while another is still in a collective
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()  # gloo aborts now and then in the interpreter's teardown
