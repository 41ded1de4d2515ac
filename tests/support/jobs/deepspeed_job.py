"""A DeepSpeed ZeRO training loop on the CPU: ``deepspeed.initialize``, ``engine.backward``, ``engine.step``.

Run under ``torchrun --nproc_per_node=2`` (or the ``deepspeed`` launcher) where DeepSpeed is
installed; it is not one of gputop's dependencies. With no GPU, DeepSpeed picks its CPU
accelerator, whose communication backend is gloo unless Intel's oneCCL bindings are installed.
The model is fp32 (ZeRO 1 and 2 take fp32 on the CPU) and the optimizer torch's AdamW
(DeepSpeed's own Adam is a C++ op compiled on first use). ``--delay-ms`` makes one sample of
each batch sleep, ``--stage`` picks the ZeRO stage.
"""

from __future__ import annotations

import argparse
import time

import deepspeed
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import gputop
from gputop.demos.teardown import exit_without_teardown


class SleepyData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each batch costs a known delay: the first sample this process reads for it sleeps.

    Counted per process, not by index: the DistributedSampler gives rank 0 the even
    indices and rank 1 the odd ones, so "every 8th index" would slow rank 0 alone.
    """

    def __init__(self, delay_s: float, batch_size: int) -> None:
        self.delay_s = delay_s
        self.batch_size = batch_size
        self.reads = 0

    def __len__(self) -> int:
        return 1 << 16

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s and self.reads % self.batch_size == 0:
            time.sleep(self.delay_s)
        self.reads += 1
        return torch.ones(64) * (index % 7), torch.tensor(index % 10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--stage", type=int, default=2, choices=(1, 2))
    args = parser.parse_args()

    deepspeed.init_distributed(dist_backend="gloo")
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    config = {
        "train_micro_batch_size_per_gpu": args.batch_size,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": args.stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
    }
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    gputop.watch(engine)
    dataset = SleepyData(args.delay_ms / 1000.0, args.batch_size)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=DistributedSampler(dataset, shuffle=False))
    steps = 0
    for x, y in gputop.track(loader):
        loss = nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss)
        engine.step()
        steps += 1
        if steps == args.steps:
            break
    rank = deepspeed.comm.get_rank()
    print(f"rank {rank} steps {steps} zero stage {engine.zero_optimization_stage()} "
          f"optimizer {type(optimizer).__name__} backend {torch.distributed.get_backend()}", flush=True)  # fmt: skip
    deepspeed.comm.barrier()  # no rank tears gloo down while another is still in a collective
    deepspeed.comm.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()  # gloo aborts now and then in the interpreter's teardown
