"""Jobs written the way public training scripts are, added *before* any rule was tuned to them.

pytorch/examples (minGPT-ddp), torchvision's reference scripts and the Hugging
Face examples were the models: a metric computed after the optimizer step, a
checkpoint every N steps, gradient accumulation, tokenising in the collate
function, a rank that blocks for good, a neighbour process that takes a core,
batches padded to their longest text.  Their first scores, before any rule
changed, are in docs/diagnosis.md.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from common import Deadline, finish, start
from steady_cases import cifar_convnet, images
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import gputop

# A hang is called after 5 s without a step and must show within 15 s: a hung job is kept this long
# after the hang began, however late it began (on one shared core step 40 came 8 s into a 14-s
# budget, and the job left before anything could be called).
HANG_KEPT_S = 15.0


class _ExitAt:
    """End this rank when the budget is spent, wherever it is blocked (a hung job never ends by itself)."""

    def __init__(self, seconds: float) -> None:
        self.at_s = time.monotonic() + seconds
        threading.Thread(target=self._leave, daemon=True).start()

    def hang_begins(self) -> None:
        """The hang starts now: keep the rank HANG_KEPT_S more at least."""
        self.at_s = max(self.at_s, time.monotonic() + HANG_KEPT_S)

    def _leave(self) -> None:
        while (left := self.at_s - time.monotonic()) > 0:
            time.sleep(min(left, 0.5))
        print(f"rank {os.environ.get('RANK')}: budget spent while hung, leaving", flush=True)
        os._exit(0)


# The step the hang begins at: early, so that it comes within the run on a machine twice as slow (it was step 40,
# and under a neighbour process a run reached step 36 in its 14-s budget and never hung), after enough steps for
# the job's usual step time.  The runner's premise_step for the case is this step.
HANG_STEP = 10


def hang_rank1_lock(seconds: float) -> None:
    """At step 10 rank 1 waits on a lock a forgotten thread holds; rank 0 waits in its next all-reduce."""
    rank = start()
    leave = _ExitAt(seconds)
    model = nn.parallel.DistributedDataParallel(cifar_convnet(), bucket_cap_mb=0.25)
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(images(), batch_size=32, shuffle=True)
    lock = threading.Lock()
    steps = 0

    def wait_for_lock() -> None:
        with lock:  # never released: the holder below never finishes
            pass

    holder = threading.Thread(target=lambda: (lock.acquire(), time.sleep(1e9)), daemon=True)
    while True:
        for x, y in gputop.track(loader):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            steps += 1
            if steps == HANG_STEP:
                leave.hang_begins()  # rank 0 too: it will wait for rank 1 in its next all-reduce
            if steps == HANG_STEP and rank == 1:
                holder.start()
                time.sleep(0.1)
                wait_for_lock()


class Metric:
    """An epoch-style metric recomputed every step over the last 16384 predictions (a common mistake)."""

    def __init__(self) -> None:
        self.scores: list[float] = []

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> float:
        self.scores.extend(logits.softmax(1).gather(1, targets[:, None]).squeeze(1).tolist())
        self.scores = self.scores[-16384:]
        ranked = sorted(self.scores)
        return sum(math.log(s + 1e-9) for s in ranked) / len(ranked)


def straggler_metric_after_step_rank1(seconds: float) -> None:
    """Rank 1 computes a Python metric after optimizer.step() every step (rank 0 logs nothing)."""
    rank = start()
    model = nn.parallel.DistributedDataParallel(cifar_convnet(), bucket_cap_mb=0.25)
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = images()
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data))
    metric = Metric()
    deadline, steps = Deadline(seconds), 0
    while True:
        for x, y in gputop.track(loader):
            opt.zero_grad()
            logits = model(x)
            nn.functional.cross_entropy(logits, y).backward()
            opt.step()
            if rank == 1:
                # 12 updates: the first score's 4 cost 9-19% of rank 1's step, straddling the 10% line (a
                # coin toss between healthy and straggler, not a test of either); 12 put it near 30%.
                for _ in range(12):
                    metric.update(logits.detach(), y)
            steps += 1
            if deadline.reached(steps):
                finish(rank, steps)
                return


def allocation_outside_cpu_hog(seconds: float) -> None:
    """A healthy convnet while another program (not the job's) burns one of the two cores."""
    rank = start()
    hog = None
    if rank == 0:
        # Started through a shell that exits at once, so the hog is nobody's child: not the job's, like
        # another user's program, and it ends by itself after the run.
        burn = f"import time; end = time.time() + {seconds + 5}\nwhile time.time() < end: pass"
        started = subprocess.run(
            ["sh", "-c", f'{sys.executable} -c "$0" >/dev/null 2>&1 & echo $!', burn],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        hog = int(started.stdout.split()[0])
    model = nn.parallel.DistributedDataParallel(cifar_convnet(), bucket_cap_mb=0.25)
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = images()
    loader = DataLoader(data, batch_size=64, sampler=DistributedSampler(data))
    deadline, steps = Deadline(seconds), 0
    try:
        while True:
            for x, y in gputop.track(loader):
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                steps += 1
                if deadline.reached(steps):
                    finish(rank, steps)
                    return
    finally:
        if hog is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(hog, signal.SIGKILL)


# Three checkpoints at least, two of them inside a measured step (a stall is a pattern from two on): at a third
# of a quiet run's speed (a busy neighbour's), the 14-s budget would end at the stop check of step 20, with one.
MIN_CHECKPOINT_STEPS = 30


def stall_checkpoint_every_10_rank0(seconds: float) -> None:
    """Rank 0 checkpoints every 10 steps (torch.save and a 1.5-s flush), as torchvision's references do per epoch."""
    rank = start()
    model = nn.parallel.DistributedDataParallel(cifar_convnet(), bucket_cap_mb=0.25)
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(images(), batch_size=48, shuffle=True)
    deadline, steps = Deadline(seconds), 0
    with tempfile.TemporaryDirectory(prefix="gputop-bench-ckpt-") as folder:
        while True:
            for x, y in gputop.track(loader):
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                steps += 1
                if rank == 0 and steps % 10 == 0:
                    torch.save({"model": model.module.state_dict(), "step": steps}, os.path.join(folder, "ckpt.pt"))
                    time.sleep(1.5)
                if steps >= MIN_CHECKPOINT_STEPS and deadline.reached(steps):
                    finish(rank, steps)
                    return


def stall_irregular(seconds: float) -> None:
    """Every rank uploads logs at irregular steps (~1 s each), the way a log shipper flushes when its buffer fills."""
    rank = start()
    model = nn.parallel.DistributedDataParallel(cifar_convnet(), bucket_cap_mb=0.25)
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(images(), batch_size=48, shuffle=True)
    flushes = set(random.Random(7).sample(range(8, 400), 25))  # the same steps on every rank
    deadline, steps = Deadline(seconds), 0
    while True:
        for x, y in gputop.track(loader):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            steps += 1
            if steps in flushes:
                time.sleep(1.0)
            if deadline.reached(steps):
                finish(rank, steps)
                return


def healthy_symmetric_accumulation(seconds: float) -> None:
    """Gradient accumulation over 4 micro-batches under no_sync(), the optimizer's step counted as the step."""
    rank = start()
    accumulate = 4
    model = nn.parallel.DistributedDataParallel(cifar_convnet(), bucket_cap_mb=0.25)
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = images()
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data))
    deadline, steps, micro = Deadline(seconds), 0, 0
    while True:
        for x, y in gputop.track(loader):
            micro += 1
            loss = nn.functional.cross_entropy(model(x), y) / accumulate
            if micro % accumulate:
                with model.no_sync():
                    loss.backward()
                continue
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            steps += 1
            if deadline.reached(steps):
                finish(rank, steps)
                return


class TinyGPT(nn.Module):
    """minGPT's shape, scaled to a CPU: token + position embeddings, 2 causal blocks, a head."""

    def __init__(self, vocab: int = 256, width: int = 64, context: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        block = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tokens(x) + self.positions(torch.arange(x.shape[1]))
        return self.head(self.blocks(h, mask=self.mask, is_causal=True))


class CharData(Dataset):
    def __init__(self, n: int = 4096, context: int = 64) -> None:
        self.data = torch.randint(0, 256, (n + context + 1,))
        self.context = context
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i : i + self.context + 1]
        return chunk[:-1], chunk[1:]


def healthy_mingpt_like(seconds: float) -> None:
    """pytorch/examples' minGPT-ddp, scaled down: AdamW, grad clipping, a DistributedSampler."""
    train_mingpt(TinyGPT(), CharData(), batch_size=48, seconds=seconds)


def parallelism_mingpt_batch2(seconds: float) -> None:
    """The same script with a 2-block, 32-wide GPT over 128 characters at batch 2 a rank, no workers (issue #35)."""
    train_mingpt(TinyGPT(width=32, context=128), CharData(context=128), batch_size=2, seconds=seconds)


def train_mingpt(net: nn.Module, data: Dataset, *, batch_size: int, seconds: float) -> None:
    rank = start()
    model = nn.parallel.DistributedDataParallel(net)
    gputop.watch(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=batch_size, sampler=sampler)
    deadline, steps, epoch = Deadline(seconds), 0, 0
    while True:
        sampler.set_epoch(epoch)
        for x, y in gputop.track(loader):
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            steps += 1
            if deadline.reached(steps):
                finish(rank, steps)
                return
        epoch += 1


WORDS = [f"w{i}" for i in range(5000)]


class Reviews(Dataset):
    """Raw text, as the Hugging Face examples start from."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> str:
        rng = random.Random(i)
        return " ".join(rng.choice(WORDS) for _ in range(400))


def tokenize_batch(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """A pure-Python tokenizer in collate_fn, in the main process (num_workers=0)."""
    vocab = {w: i for i, w in enumerate(WORDS)}
    ids = [[vocab.get(w, 0) for w in text.split()][:128] for text in texts]
    labels = torch.tensor([len(text) % 2 for text in texts])
    return torch.tensor(ids), labels


def data_loading_tokenize_in_collate(seconds: float) -> None:
    """A text classifier whose collate_fn tokenises raw strings on the training process."""
    rank = start()
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.EmbeddingBag(len(WORDS), 32), nn.Linear(32, 2)))
    gputop.watch(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = Reviews()
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data), collate_fn=tokenize_batch)
    deadline, steps = Deadline(seconds), 0
    for x, y in gputop.track(loader):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        if deadline.reached(steps):
            break
    finish(rank, steps)


class VariedTexts(Dataset):
    """Token ids of texts whose lengths vary as real ones do: most short, a long tail up to the model's 256."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        rng = random.Random(i)
        length = min(256, max(8, int(rng.lognormvariate(3.8, 0.9))))
        return torch.randint(1, 1000, (length,), generator=torch.Generator().manual_seed(i)), i % 2


def pad_to_longest(batch: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic padding, as Hugging Face's DataCollatorWithPadding does: each batch as long as its longest text."""
    ids = nn.utils.rnn.pad_sequence([x for x, _ in batch], batch_first=True)
    return ids, torch.tensor([y for _, y in batch])


class TextClassifier(nn.Module):
    def __init__(self, vocab: int = 1000, width: int = 64) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width, padding_idx=0)
        block = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(block, 2)
        self.head = nn.Linear(width, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.tokens(ids), src_key_padding_mask=ids == 0).mean(dim=1))


def straggler_rotating_uneven_lengths(seconds: float) -> None:
    """A text classifier on batches padded to their longest text: whichever rank drew the longest batch is last."""
    rank = start()
    model = nn.parallel.DistributedDataParallel(TextClassifier())
    gputop.watch(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = VariedTexts()
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data), collate_fn=pad_to_longest)
    deadline, steps = Deadline(seconds), 0
    for ids, labels in gputop.track(loader):
        loss = nn.functional.cross_entropy(model(ids), labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
        if deadline.reached(steps):
            break
    finish(rank, steps)


# Issue #55's cases, added before their scores were read: how a hang's run ends, and a desync the backend goes
# on through.  Their first scores are in docs/diagnosis.md.


class _SigtermAt(_ExitAt):
    """End this rank as a scheduler ends a hung job: SIGTERM (gputop's bye, then death by the signal)."""

    def _leave(self) -> None:
        while (left := self.at_s - time.monotonic()) > 0:
            time.sleep(min(left, 0.5))
        print(f"rank {os.environ.get('RANK')}: budget spent while hung, SIGTERM", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)


def _train_until_rank1_blocks(rank: int, leave: _ExitAt) -> None:
    """The convnet's DDP steps until HANG_STEP, where rank 1 waits on a queue nobody feeds; until ``leave``."""
    model = nn.parallel.DistributedDataParallel(cifar_convnet(), bucket_cap_mb=0.25)
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(images(), batch_size=32, shuffle=True)
    steps = 0
    while True:
        for x, y in gputop.track(loader):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            steps += 1
            if steps == HANG_STEP:
                leave.hang_begins()
                if rank == 1:
                    threading.Event().wait()  # a queue nobody feeds


def hang_rank1_lock_sigterm(seconds: float) -> None:
    """hang_rank1_lock, ended by SIGTERM: every rank says bye, "ended by SIGTERM", and the report must still say
    hang, with the rank that blocked."""
    rank = start()
    leave = _SigtermAt(seconds)
    _train_until_rank1_blocks(rank, leave)


def desync_metric_dtype(seconds: float) -> None:
    """A correct-looking loss average: rank 1 sums a token count (int64) where rank 0 sums a loss (float64), the
    same 8 bytes, every step from step 10.  gloo adds the bytes and the job finishes; the log is garbage."""
    rank = start()
    deadline = Deadline(seconds)

    def logged(step: int, loss: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if rank == 1 and step >= HANG_STEP:
            return torch.tensor([labels.numel()], dtype=torch.int64)  # a different thing, the same size
        return torch.tensor([loss.item()], dtype=torch.float64)

    finish(rank, train_logging_a_metric(logged, deadline.reached))


def train_logging_a_metric(
    logged: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor | None], until: Callable[[int], bool]
) -> int:
    """The convnet's DDP steps, each followed by its metric's all-reduce, until ``until(step)``; the steps taken.

    ``logged(step, loss, labels)`` is the tensor this rank all-reduces after the step, or None where it goes to
    the barrier a script ends its logging with instead."""
    model = nn.parallel.DistributedDataParallel(cifar_convnet(), bucket_cap_mb=0.25)
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(images(), batch_size=32, shuffle=True)
    steps = 0
    while True:
        for x, y in gputop.track(loader):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            steps += 1
            metric = logged(steps, loss, y)
            if metric is None:
                dist.barrier()
            else:
                dist.all_reduce(metric)
            if until(steps):
                return steps


def hang_rank1_gloo_timeout(seconds: float) -> None:
    """A process group timeout, as the docs advise: rank 1 blocks for good at step 10, rank 0's next all-reduce
    fails after 8 s with gloo's timeout and the rank exits with it; rank 1 is ended by the launcher."""
    import datetime

    os.environ.setdefault("TORCH_GLOO_TIMEOUT", "8")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=8))
    rank = dist.get_rank()
    leave = _SigtermAt(seconds)
    _train_until_rank1_blocks(rank, leave)
