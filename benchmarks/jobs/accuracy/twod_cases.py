"""2-D parallelism as pytorch/examples' ``tensor_parallelism/fsdp_tp_example.py`` builds it (issue #56), written
before any rule read it.

A Llama-like Transformer on a (dp, tp) mesh: the embedding row-wise with its output sharded on the sequence, the
norms sequence-parallel, each block's attention and feed-forward gathering the sequence in (``PrepareModuleInput``)
and scattering it out (``RowwiseParallel(output_layouts=Shard(1))``), the output projection column-wise; FSDP2 on
dp.  On two CPU ranks dp is 1 and tp 2, as the issue's run was.  The attention is written out over each rank's own
heads (local tensors), as a CPU user must: DTensor has no sharding rule for the CPU's fused attention.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from common import Deadline, finish, start
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn import functional as F

import gputop

EXTRA_MATMUL_S = 0.3  # rank 1's metric between its forward and its backward: most of a step here (~0.4 s)


@dataclass
class LlamaArgs:
    dim: int = 256
    n_layers: int = 2
    n_heads: int = 8
    vocab_size: int = 2048
    seq_len: int = 128
    batch_size: int = 8


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.n_heads, self.head_dim = args.n_heads, args.dim // args.n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(args.dim, args.dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq_len, _ = x.shape
        q, k, v = (w(x).view(bsz, seq_len, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        scores = (q @ k.transpose(-2, -1)) / self.head_dim**0.5
        causal = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)
        out = scores.masked_fill(causal, float("-inf")).softmax(-1) @ v
        return self.wo(out.transpose(1, 2).reshape(bsz, seq_len, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False), \
            nn.Linear(dim, 4 * dim, bias=False)  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(args.dim), nn.RMSNorm(args.dim)
        self.attention, self.feed_forward = Attention(args), FeedForward(args.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    def __init__(self, args: LlamaArgs) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.norm = nn.RMSNorm(args.dim)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def two_d_llama(args: LlamaArgs) -> nn.Module:
    """The example's plan: tensor and sequence parallel on tp, then FSDP2 per block and the root on dp."""
    mesh = init_device_mesh("cpu", (1, dist.get_world_size()), mesh_dim_names=("dp", "tp"))
    tp = mesh["tp"]
    torch.manual_seed(0)
    model = Llama(args)
    parallelize_module(model, tp, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })  # fmt: skip
    for block in model.layers:
        parallelize_module(block, tp, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        })  # fmt: skip
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def train_two_d(seconds: float, extra_on_rank1_s: float = 0.0) -> None:
    rank = start()
    args = LlamaArgs()
    model = two_d_llama(args)
    gputop.watch(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=True)
    probe = torch.randn(256, 256)
    deadline = Deadline(seconds)
    for steps, (x, y) in enumerate(gputop.track(token_batches(args)), start=1):
        logits = model(x)
        if rank == 1 and extra_on_rank1_s:  # a quality metric in Python, only this rank, before the backward
            started = time.perf_counter()
            while time.perf_counter() - started < extra_on_rank1_s:
                probe = torch.tanh(probe @ probe * 1e-3)
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()
        if deadline.reached(steps):
            finish(rank, steps)
            return


def token_batches(args: LlamaArgs) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Next-token batches, the same on every tp rank (the example seeds by the dp rank, here 0 on both)."""
    generator = torch.Generator().manual_seed(0)
    while True:
        batch = torch.randint(args.vocab_size, (args.batch_size, args.seq_len + 1), generator=generator)
        yield batch[:, :-1], batch[:, 1:]


def twod_healthy(seconds: float) -> None:
    """The example's 2-D job as it is."""
    train_two_d(seconds)


def twod_straggler_metric_between_passes_rank1(seconds: float) -> None:
    """Rank 1 computes a metric of matrix work between its forward and its backward; rank 0 waits in tp's
    collectives of the backward."""
    train_two_d(seconds, EXTRA_MATMUL_S)
