"""Cases whose cause is how the model meets DDP: gradient exchange, too little work, DDP settings.

Each function is one whole training job as a user would write it; the
expected cause is in the runner's catalogue (benchmarks/diagnosis_accuracy.py).
"""

from __future__ import annotations

import torch
from common import Deadline, finish, start
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import gputop

FORTY = 40  # steps of the short tiny run


def _train(model: nn.Module, loader: DataLoader, seconds: float, rank: int, lr: float = 0.01) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    deadline, steps = Deadline(seconds), 0
    while True:
        for x, y in gputop.track(loader):
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            steps += 1
            if deadline.reached(steps):
                finish(rank, steps)
                return


def communication_wide_mlp(seconds: float) -> None:
    """A 2048-wide MLP with LayerNorm/GELU at batch 16: 50 MB of gradients for a few ms of compute."""
    rank = start()
    blocks: list[nn.Module] = []
    for _ in range(3):
        blocks += [nn.Linear(2048, 2048), nn.LayerNorm(2048), nn.GELU()]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*blocks, nn.Linear(2048, 10)))
    gputop.watch(model)
    data = TensorDataset(torch.randn(2048, 2048), torch.randint(0, 10, (2048,)))
    _train(model, DataLoader(data, batch_size=16, sampler=DistributedSampler(data)), seconds, rank)


class BagClassifier(nn.Module):
    """Bag-of-tokens text classifier: a big dense embedding table, a small head."""

    def __init__(self, vocab: int, dim: int, classes: int) -> None:
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(tokens))


def communication_embedding_table(seconds: float) -> None:
    """A 250k x 64 embedding (dense gradients: 64 MB a step) and a linear head; the table is exchanged whole."""
    rank = start()
    model = nn.parallel.DistributedDataParallel(BagClassifier(250_000, 64, 2))
    gputop.watch(model)
    data = TensorDataset(torch.randint(0, 250_000, (4096, 24)), torch.randint(0, 2, (4096,)))
    _train(model, DataLoader(data, batch_size=32, shuffle=True), seconds, rank, lr=0.1)


def parallelism_tiny_mlp(seconds: float) -> None:
    """A 16-32-4 MLP at batch 2: each step is a few hundred microseconds of real work."""
    rank = start()
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    gputop.watch(model)
    data = TensorDataset(torch.randn(1024, 16), torch.randint(0, 4, (1024,)))
    _train(model, DataLoader(data, batch_size=2, sampler=DistributedSampler(data)), seconds, rank)


def parallelism_forty_tiny_steps(seconds: float) -> None:
    """The same tiny MLP for 40 steps only, as a script's first try runs: well under a second in all."""
    rank = start()
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    gputop.watch(model)
    data = TensorDataset(torch.randn(1024, 16), torch.randint(0, 4, (1024,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(data, batch_size=2, sampler=DistributedSampler(data))
    for step, (x, y) in enumerate(gputop.track(loader), start=1):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step == FORTY:
            break
    finish(rank, FORTY)


def parallelism_tiny_bag_of_words(seconds: float) -> None:
    """A 1000-token, 16-dim bag-of-words classifier at batch 4."""
    rank = start()
    model = nn.parallel.DistributedDataParallel(BagClassifier(1000, 16, 3))
    gputop.watch(model)
    data = TensorDataset(torch.randint(0, 1000, (1024, 12)), torch.randint(0, 3, (1024,)))
    _train(model, DataLoader(data, batch_size=4, shuffle=True), seconds, rank, lr=0.1)


def small_convnet(depth: int, width: int, image_px: int = 32) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, width, 3, padding=1), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
    return nn.Sequential(*layers, nn.MaxPool2d(4), nn.Flatten(), nn.Linear(width * (image_px // 4) ** 2, 10))


def model_config_find_unused(seconds: float) -> None:
    """DDP(find_unused_parameters=True) on a convnet whose every parameter is used: a wasted graph traversal."""
    rank = start()
    model = nn.parallel.DistributedDataParallel(small_convnet(depth=4, width=32), find_unused_parameters=True)
    gputop.watch(model)
    data = TensorDataset(torch.randn(1024, 3, 32, 32), torch.randint(0, 10, (1024,)))
    _train(model, DataLoader(data, batch_size=32, sampler=DistributedSampler(data)), seconds, rank)


def model_config_tiny_buckets(seconds: float) -> None:
    """bucket_cap_mb=0.001 on a 40-layer convnet: one all-reduce per layer, ~40 buckets (the line: 16)."""
    rank = start()
    model = nn.parallel.DistributedDataParallel(small_convnet(depth=40, width=16, image_px=16), bucket_cap_mb=0.001)
    gputop.watch(model)
    data = TensorDataset(torch.randn(1024, 3, 16, 16), torch.randint(0, 10, (1024,)))
    _train(model, DataLoader(data, batch_size=32, shuffle=True), seconds, rank)


def healthy_compute_bound_mlp(seconds: float) -> None:
    """A 1024-wide, 4-layer MLP at batch 1024 a rank: ~17 GFLOP of matmuls a step against 13 MB of gradients.

    Each step does its CPU's worth of work (issue #46): the matmuls run near the core's peak, and the exchange
    is a few percent of a step this long.  Written first at batch 256, it was not healthy on gloo: the exchange
    took a real 17-18% of its 85-ms steps, and gputop said so (communication, 3 runs of 3).
    """
    rank = start()
    blocks: list[nn.Module] = []
    for _ in range(3):
        blocks += [nn.Linear(1024, 1024), nn.ReLU()]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*blocks, nn.Linear(1024, 10)))
    gputop.watch(model)
    data = TensorDataset(torch.randn(16384, 1024), torch.randint(0, 10, (16384,)))
    _train(model, DataLoader(data, batch_size=1024, sampler=DistributedSampler(data)), seconds, rank)
