"""Jobs on the stacks beyond DDP (issue #34), written as their public examples are, before any rule saw them.

pytorch/examples' ``distributed/FSDP2/example.py`` (a small Transformer built on
the meta device, ``fully_shard`` per block then the root), its
``tensor_parallelism`` examples (``parallelize_module`` with ``ColwiseParallel`` /
``RowwiseParallel`` on an MLP's linears over a 2-D mesh's ``tp`` dimension) and
Accelerate's ``nlp_example.py`` loop (``accelerator.prepare``,
``accelerator.backward``) were the models.  Their first scores, before any rule
changed, are in docs/diagnosis.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from common import Deadline, finish, start
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import gputop

METRIC_UPDATES = 20  # metric updates a step on rank 1 (~8 ms each): about half its step here, far from the 10% line
TP_DIM = 64  # narrow layers: each all-reduce moves batch x dim floats for little matmul work
TP_BATCH = 2048
LOADER_DELAY_S = 0.004  # each sample's read in the Accelerate case

# -- the FSDP2 example's model ------------------------------------------------------------------


@dataclass
class ModelArgs:
    n_layers: int = 2
    vocab_size: int = 1024
    max_seq_len: int = 64
    dim: int = 128
    n_heads: int = 4


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.head_dim = args.n_heads, args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.dim, bias=False)
        self.wk = nn.Linear(args.dim, args.dim, bias=False)
        self.wv = nn.Linear(args.dim, args.dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bsz, seq_len, _ = x.size()
        q, k, v = (w(x).view(bsz, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))  # fmt: skip
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bsz, seq_len, -1))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(args.dim)
        self.attention = Attention(args)
        self.ffn_norm = nn.LayerNorm(args.dim)
        self.feed_forward = nn.Sequential(
            nn.Linear(args.dim, 4 * args.dim), nn.GELU(), nn.Linear(4 * args.dim, args.dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """A toy nanoGPT, as the FSDP2 example's model.py is."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.pos_embeddings = nn.Embedding(args.max_seq_len, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = nn.LayerNorm(args.dim)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) + self.pos_embeddings(torch.arange(tokens.size(1)))
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h)).float()


class Tokens(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Next-token pairs from a fixed random corpus (no download), one sequence per index."""

    def __init__(self, args: ModelArgs, n: int = 4096) -> None:
        shape = (n, args.max_seq_len + 1)
        self.corpus = torch.randint(0, args.vocab_size, shape, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.corpus)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        seq = self.corpus[index]
        return seq[:-1], seq[1:]


def sharded_transformer(args: ModelArgs, mesh: DeviceMesh, reshard_after_forward: bool | None = None) -> nn.Module:
    """Built on the meta device, fully_shard per block then the root, materialized on the CPU (the example's way).

    ``reshard_after_forward=None`` is FSDP2's default: True for the blocks, False for the root.
    """
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Transformer(args)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    model.to_empty(device="cpu")
    for module in model.modules():
        reset = getattr(module, "reset_parameters", None)
        if module is not model and callable(reset):
            reset()
    return model


class TokenAccuracy:
    """Accuracy and median loss over the last 32768 tokens, recomputed in Python each update (a common habit)."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.hits: list[bool] = []

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
        flat, wanted = logits.detach().flatten(0, 1), targets.flatten()
        self.losses.extend(F.cross_entropy(flat, wanted, reduction="none").tolist())
        self.hits.extend((flat.argmax(1) == wanted).tolist())
        self.losses, self.hits = self.losses[-32768:], self.hits[-32768:]
        median = sorted(self.losses)[len(self.losses) // 2]
        return sum(self.hits) / len(self.hits), math.exp(median)


def _fsdp2_train(seconds: float, args: ModelArgs, batch_size: int, *, metric_rank: int | None = None,
                 metric_updates: int = 0, reshard_after_forward: bool | None = None) -> None:  # fmt: skip
    rank = start()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("dp",))
    model = sharded_transformer(args, mesh, reshard_after_forward)
    gputop.watch(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = Tokens(args)
    sampler: DistributedSampler[int] = DistributedSampler(data)
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler)
    metric = TokenAccuracy()
    deadline, steps, epoch = Deadline(seconds), 0, 0
    while True:
        sampler.set_epoch(epoch)
        for tokens, targets in gputop.track(loader):
            logits = model(tokens)
            loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optim.step()
            optim.zero_grad()
            if rank == metric_rank:
                for _ in range(metric_updates):
                    metric.update(logits, targets)
            steps += 1
            if deadline.reached(steps):
                finish(rank, steps)
                return
        epoch += 1


def fsdp2_healthy(seconds: float) -> None:
    """The FSDP2 example: 4 blocks of dim 128, batch 16 x 64 tokens, AdamW, balanced ranks.

    Healthy on a GPU.  On gloo the training thread waits out every all-gather: 20% of each step at batch 16
    ("too little work per step at batch 16 … at batch 64 it would be about 7%", issue #35's quiet run) and
    still 12% at batch 64 (the projection is a floor of the share), so the benchmark voids it on the CPU
    (``gpu_premise``).
    """
    _fsdp2_train(seconds, ModelArgs(n_layers=4, dim=128), batch_size=16)


def fsdp2_straggler_metric_rank1(seconds: float) -> None:
    """The same job; rank 1 recomputes a token-accuracy metric in Python after optimizer.step() each step."""
    _fsdp2_train(seconds, ModelArgs(n_layers=4, dim=128), batch_size=16, metric_rank=1, metric_updates=METRIC_UPDATES)


def fsdp2_exposed_all_gather(seconds: float) -> None:
    """3 blocks of dim 512 (12.6 MB each, 42 MB in all) at batch 2 x 16 tokens, resharded after forward, no prefetch.

    Sized as communication_wide_mlp is: tens of MB through gloo each step for a few tens of ms of compute, so
    the step is long (far from the tiny-step line) and most of it is the blocks' all-gathers, twice a step.
    """
    _fsdp2_train(seconds, ModelArgs(n_layers=3, dim=512, max_seq_len=16), batch_size=2, reshard_after_forward=True)


def fsdp2_all_gathers_unhidden(seconds: float) -> None:
    """4 blocks of dim 192 at batch 32 x 16 tokens (issue #46's second case): ~200-ms steps on gloo.

    Not a short step: the blocks' all-gathers cannot hide behind compute on a CPU backend, a quarter of each step.
    """
    _fsdp2_train(seconds, ModelArgs(n_layers=4, dim=192, max_seq_len=16), batch_size=32)


# -- tensor parallelism -------------------------------------------------------------------------


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(F.relu(self.w1(self.norm(x))))


class DeepMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, n_layers: int, classes: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(FeedForward(dim, hidden) for _ in range(n_layers))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def tp_group_critical_path(seconds: float) -> None:
    """A (dp=1, tp=2) mesh; each layer's w1 column-wise, w2 row-wise: an all-reduce on tp in every layer, both ways."""
    rank = start()
    mesh = init_device_mesh("cpu", (1, dist.get_world_size()), mesh_dim_names=("dp", "tp"))
    dp_mesh, tp_mesh = mesh["dp"], mesh["tp"]
    torch.manual_seed(0)
    model = DeepMLP(dim=TP_DIM, hidden=4 * TP_DIM, n_layers=8, classes=10)
    for layer in model.layers:
        parallelize_module(layer, tp_mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    gputop.watch(model)
    # One tensor at a time: the norms and the head stay plain tensors, which a foreach step cannot mix with DTensors.
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    data = torch.utils.data.TensorDataset(torch.randn(16384, TP_DIM), torch.randint(0, 10, (16384,)))
    # The tp ranks see the same batch: the sampler splits over the dp dimension only.
    sampler: DistributedSampler[int] = DistributedSampler(
        data, num_replicas=dp_mesh.size(), rank=dp_mesh.get_local_rank()
    )
    loader = DataLoader(data, batch_size=TP_BATCH, sampler=sampler)
    deadline, steps, epoch = Deadline(seconds), 0, 0
    while True:
        sampler.set_epoch(epoch)
        for x, y in gputop.track(loader):
            F.cross_entropy(model(x), y).backward()
            optim.step()
            optim.zero_grad()
            steps += 1
            if deadline.reached(steps):
                finish(rank, steps)
                return
        epoch += 1


# -- Accelerate ---------------------------------------------------------------------------------


class SlowReviews(Dataset[dict[str, torch.Tensor]]):
    """Tokenized reviews read one file at a time from slow storage (a few ms each), as nlp_example's batches look."""

    def __init__(self, n: int, seq_len: int, vocab: int, delay_s: float) -> None:
        self.n, self.seq_len, self.vocab, self.delay_s = n, seq_len, vocab, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        time.sleep(self.delay_s)
        ids = torch.randint(1, self.vocab, (self.seq_len,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": torch.tensor(index % 2)}


class ReviewClassifier(nn.Module):
    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, 4, 4 * dim, batch_first=True), 2)
        self.head = nn.Linear(dim, 2)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(input_ids)).mean(1))


def accelerate_loader_bound(seconds: float) -> None:
    """Accelerate's plain loop (prepare, accelerator.backward) on CPUs; each sample sleeps 4 ms, 0 workers."""
    from accelerate import Accelerator  # here: the other cases need not import it

    torch.set_num_threads(1)
    # nlp_example's --cpu: without it, on a machine with no GPU, Accelerator() under torchrun picks
    # DistributedType.NO and each rank trains alone; with it, MULTI_CPU, gloo, the model wrapped in DDP.
    accelerator = Accelerator(cpu=True)
    model = ReviewClassifier(vocab=2048, dim=64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    train_dataloader = DataLoader(SlowReviews(4096, 64, 2048, delay_s=LOADER_DELAY_S), batch_size=16, shuffle=True)
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    gputop.watch(model)
    model.train()
    deadline, steps = Deadline(seconds), 0
    while True:
        for batch in gputop.track(train_dataloader):
            loss = F.cross_entropy(model(batch["input_ids"]), batch["labels"])
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
            if deadline.reached(steps):
                finish(accelerator.process_index, steps)
                return


# -- torch.compile fed the shapes of its data ------------------------------------------------------


class VariableReviews(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Reviews of 8 to 64 tokens, as a tokenizer leaves them before any padding."""

    def __init__(self, n: int, vocab: int) -> None:
        self.n, self.vocab = n, vocab

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(index)
        length = int(torch.randint(8, 65, (1,), generator=g))
        return torch.randint(1, self.vocab, (length,), generator=g), torch.tensor(index % 2)


# The fourth length first comes at step 24 (its recompile then), the benchmark's premise is step 30 (the case's
# ``premise_step``): the job runs at least to 40, the next stop check after it.
RECOMPILED_BY_STEP = 40


class LengthWarmup:
    """Sequence-length warm-up, as curriculum schedules do it: batches padded (or cut) to 16 tokens for the first
    8 steps, then 32, 48, and 64 from step 24 on, the same on every rank (the schedule goes by the step)."""

    def __init__(self) -> None:
        self.batches = 0

    def __call__(self, batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        length = 16 * (1 + min(3, self.batches // 8))
        self.batches += 1
        texts, labels = zip(*batch, strict=True)
        padded = torch.zeros(len(texts), length, dtype=texts[0].dtype)
        for row, text in enumerate(texts):
            padded[row, : min(len(text), length)] = text[:length]
        return padded, torch.stack(labels)


def compile_recompiling_padded_batches(seconds: float) -> None:
    """DDP(torch.compile(model, dynamic=False)), as people write it for speed, fed a sequence-length warm-up: each
    new length is a new graph, compiled again when it first appears (steps 9, 17 and 25).

    First written with batches padded to their longest text (a multiple of 16): uniform 8-64-token texts made
    the longest over 48 in 93% of batches, one recompile a rank; mostly short texts then gave three lengths, but
    each rank drew its own, and the others waited for the longest (a data-driven rotation, 46% of each step,
    which is what gputop then named).  A schedule by step gives every rank the same length: recompiles alone."""
    rank = start()
    model = nn.parallel.DistributedDataParallel(torch.compile(ReviewClassifier(vocab=2048, dim=32), dynamic=False))
    gputop.watch(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = VariableReviews(4096, 2048)
    sampler: DistributedSampler[int] = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler, collate_fn=LengthWarmup())
    deadline, steps = Deadline(seconds), 0
    for texts, labels in gputop.track(loader):
        F.cross_entropy(model(texts), labels).backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
        # Past the last recompile, however slowly this machine compiles: under a CPU neighbour the four graphs
        # took more than the budget (step 10 of 30 in 71 s, 2026-11-28), and the run was void.
        if steps >= RECOMPILED_BY_STEP and deadline.reached(steps):
            break
    finish(rank, steps)
