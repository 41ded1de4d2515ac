"""A user's small GPT at batch 2 a rank (issue #35): a short step whose gradient exchange is a fifth of it."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import gputop
from gputop.demos.teardown import exit_without_teardown

VOCAB, CONTEXT, WIDTH = 65, 192, 32


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        mask = torch.triu(torch.ones(x.size(1), x.size(1), dtype=torch.bool), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        return self.head(self.blocks(x))


class Chars(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self) -> None:
        self.text = torch.randint(0, VOCAB, (100_000,), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.text) - CONTEXT - 1

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.text[i : i + CONTEXT], self.text[i + 1 : i + CONTEXT + 1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = Chars()
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data))
    model = nn.parallel.DistributedDataParallel(GPT())
    gputop.watch(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step, (x, y) in enumerate(gputop.track(loader), 1):
        loss = nn.functional.cross_entropy(model(x).view(-1, VOCAB), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step == args.steps:
            break
    dist.barrier()  # no rank tears gloo down while another is still in a collective
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()  # gloo aborts now and then in the interpreter's teardown
