"""An FSDP2 job written as pytorch/examples' distributed/FSDP2/example.py is: a small Transformer sharded per block.

``fully_shard`` on each block, then on the root; ``gputop.watch(model)`` after it, as a user adds it.
Options make the things gputop must see: ``--extra-ms`` of Python work on one rank after each step (a
straggler), ``--no-prefetch`` / ``--reshard-after-forward`` layouts, ``--mixed-precision`` through
``MixedPrecisionPolicy``, ``--tp`` for a 2-D (dp, tp) mesh with the blocks' linears tensor-parallel.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils.data import DataLoader, Dataset

import gputop


class Tokens(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, seq_len: int, vocab: int) -> None:
        self.seq_len, self.vocab = seq_len, vocab

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(index)
        tokens = torch.randint(0, self.vocab, (self.seq_len + 1,), generator=g)
        return tokens[:-1], tokens[1:]


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.out(self.norm(x))


def busy(seconds: float) -> float:
    """Python work on the CPU (an evaluation metric computed every step, say): it spins, it does not sleep."""
    end, total = time.perf_counter() + seconds, 0.0
    scores = [((k * 7919) % 1000) / 1000.0 for k in range(2048)]
    while time.perf_counter() < end:
        total += sum(s * s for s in sorted(scores)[:256])
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--extra-ms", type=float, default=0.0, help="Python work after each step on --extra-rank")
    parser.add_argument("--extra-rank", type=int, default=1)
    parser.add_argument("--reshard-after-forward", action="store_true", help="also on the root (the example's)")
    parser.add_argument("--no-prefetch", action="store_true", help="no forward/backward prefetch between blocks")
    parser.add_argument("--mixed-precision", action="store_true", help="MixedPrecisionPolicy(param_dtype=bfloat16)")
    parser.add_argument("--no-watch", action="store_true")
    parser.add_argument("--tp", action="store_true", help="a (dp, tp) mesh, every rank on tp: the MLPs tensor-parallel")
    parser.add_argument("--hang-at", type=int, default=0, help="rank 1 blocks before this step's forward")
    parser.add_argument("--hang-s", type=float, default=60.0, help="for this long (--hang-at)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    world = dist.get_world_size()
    model = Transformer(vocab=256, dim=args.dim, heads=4, layers=args.layers)
    if args.tp:  # pytorch/examples' 2-D pattern: tensor parallel inside each block, FSDP2 across the dp dimension
        mesh_2d = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "tp"))
        mesh = mesh_2d["dp"]
        for layer in model.layers:
            assert isinstance(layer, Block)
            parallelize_module(layer.mlp, mesh_2d["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    else:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    shard = {"mesh": mesh, **({"mp_policy": policy} if args.mixed_precision else {})}
    for layer in model.layers:
        fully_shard(layer, **shard)
    fully_shard(model, reshard_after_forward=args.reshard_after_forward, **shard)
    if not args.no_prefetch:  # explicit prefetching, as the example's --explicit-prefetching does
        blocks = list(model.layers)
        for i, layer in enumerate(blocks):
            layer.set_modules_to_forward_prefetch(blocks[i + 1 : i + 2])
            layer.set_modules_to_backward_prefetch(blocks[i - 1 : i] if i else [])
    if not args.no_watch:
        gputop.watch(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(Tokens(args.seq_len, 256), batch_size=args.batch_size)
    rank = dist.get_rank()
    steps = 0
    for tokens, targets in gputop.track(loader):
        if args.hang_at and steps == args.hang_at and rank == 1:
            threading.Event().wait(args.hang_s)  # blocked, no CPU; rank 0 waits in the forward's first TP collective
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if args.extra_ms and rank == args.extra_rank:
            busy(args.extra_ms / 1000.0)
        steps += 1
        if steps == args.steps:
            break
    print(f"rank {rank} steps {steps} loss {loss.item():.3f} pid {os.getpid()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
