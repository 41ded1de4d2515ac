"""Cases whose cause is on the input side or the host: slow loaders, a slow rank, too many threads.

Each function is one whole training job as a user would write it; the
expected cause is in the runner's catalogue (benchmarks/diagnosis_accuracy.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from common import Deadline, finish, mark_onset, start
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset

import gputop


class SlowDisk(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each sample waits on a read (sleep: I/O, not CPU) before it is decoded."""

    def __init__(self, read_s: float, features: int = 64) -> None:
        self.read_s = read_s
        self.features = features

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.read_s:
            time.sleep(self.read_s)
        return torch.full((self.features,), float(index % 13)), torch.tensor(index % 10)


def mlp(width: int = 128, features: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(features, width), nn.ReLU(), nn.Linear(width, 10))


def data_loading_sleepy_worker(seconds: float) -> None:
    """DistributedSampler, one worker that reads each sample from a slow disk (4 ms a sample, 32 a batch)."""
    rank = start()
    data = SlowDisk(read_s=0.004)
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data), num_workers=1)
    model = nn.parallel.DistributedDataParallel(mlp())
    gputop.watch(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    deadline, steps = Deadline(seconds), 0
    for x, y in gputop.track(loader):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        if deadline.reached(steps):
            break
    finish(rank, steps)


class ShardStream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sequences streamed from remote shards: every record waits 3 ms on the network."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        record = self.rank
        while True:
            time.sleep(0.003)
            yield torch.randn(8, 128), torch.tensor(record % 5)
            record += self.world


def data_loading_stream_main_process(seconds: float) -> None:
    """An IterableDataset sharded by rank by hand, fetched in the main process, a 1-D convnet on it."""
    rank = start()
    loader = DataLoader(ShardStream(rank, dist.get_world_size()), batch_size=16)
    net = nn.Sequential(
        nn.Conv1d(8, 32, 5, padding=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(32, 5)
    )
    model = nn.parallel.DistributedDataParallel(net)
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    deadline, steps = Deadline(seconds), 0
    for x, y in gputop.track(loader):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
        if deadline.reached(steps):
            break
    finish(rank, steps)


class ColdCache(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Images served from memory until the cache is evicted at ``cold_after_t``; then each is read from disk."""

    def __init__(self, cold_after_t: float) -> None:
        self.cold_after_t = cold_after_t
        self.cold = False
        self.images = torch.randn(1024, 3, 32, 32)

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if time.time() >= self.cold_after_t:
            if not self.cold:
                self.cold = True
                mark_onset()
            time.sleep(0.004)  # 4 ms a 3 KB image: a network disk
        return self.images[index % 1024], torch.tensor(index % 10)


def data_loading_onset(seconds: float) -> None:
    """A healthy convnet job for the first 40% of the run; then its loader turns slow (the time-to-finding case)."""
    rank = start()
    data = ColdCache(cold_after_t=time.time() + 0.4 * seconds)
    loader = DataLoader(data, batch_size=64, shuffle=False)
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 8 * 8, 10),
    )  # fmt: skip
    model = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.25)
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    deadline, steps = Deadline(seconds), 0
    for x, y in gputop.track(loader):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        if deadline.reached(steps):
            break
    finish(rank, steps)


def straggler_slow_loader_rank1(seconds: float) -> None:
    """Rank 1's shard sits on a slow disk (its worker waits 6 ms a sample); rank 0's is in memory."""
    rank = start()
    data = SlowDisk(read_s=0.006 if rank == 1 else 0.0, features=256)
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, shuffle=True), num_workers=1)
    model = nn.parallel.DistributedDataParallel(mlp(width=256, features=256))
    gputop.watch(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    deadline, steps = Deadline(seconds), 0
    for x, y in gputop.track(loader):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        if deadline.reached(steps):
            break
    finish(rank, steps)


def straggler_extra_compute_rank1(seconds: float) -> None:
    """Rank 1 also computes an expensive metric after every step (80 ms of matmuls); rank 0 waits for it."""
    _mlp_with_extra_work_on_rank1(seconds, lambda step_s: 0.08)


def straggler_short_run_rank1(seconds: float) -> None:
    """A run of about 3 s (the case's own length): rank 1 does 80% more work each step, as much matrix work again
    as most of its own step (a second model it evaluates); rank 0 waits for it every step."""
    _mlp_with_extra_work_on_rank1(seconds, lambda step_s: 0.8 * step_s)


def _mlp_with_extra_work_on_rank1(seconds: float, extra_s: Callable[[float], float]) -> None:
    """The DDP MLP; after each optimizer step rank 1 alone does matrix work for ``extra_s(its step's time)``."""
    rank = start()
    x_all, y_all = torch.randn(4096, 128), torch.randint(0, 10, (4096,))
    model = nn.parallel.DistributedDataParallel(mlp(width=256, features=128))
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = torch.randn(384, 384)
    deadline, steps = Deadline(seconds), 0
    loader = DataLoader(torch.utils.data.TensorDataset(x_all, y_all), batch_size=64, shuffle=True)
    while True:
        for x, y in gputop.track(loader):
            started = time.perf_counter()
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if rank == 1:  # a "quality metric" only this rank computes
                work_s = extra_s(time.perf_counter() - started)
                started = time.perf_counter()
                while time.perf_counter() - started < work_s:
                    probe = torch.tanh(probe @ probe * 1e-3)
            steps += 1
            if deadline.reached(steps):
                finish(rank, steps)
                return


class BookkeepingSGD(torch.optim.SGD):
    """SGD whose step also keeps each parameter's norm for a while, as scripts that log inside the optimizer do."""

    def __init__(self, params: Iterator[nn.Parameter], keep_for_s: float, lr: float) -> None:
        super().__init__(params, lr=lr)
        self.keep_for_s = keep_for_s
        self.norms: list[float] = []

    def step(self, closure=None):  # type: ignore[no-untyped-def]  # torch's own signature
        loss = super().step(closure)
        started = time.perf_counter()
        while time.perf_counter() - started < self.keep_for_s:
            self.norms = [*self.norms, *(float(p.detach().norm()) for g in self.param_groups for p in g["params"])]
            self.norms = self.norms[-4096:]
        return loss


def straggler_slow_optimizer_rank1(seconds: float) -> None:
    """Rank 1's optimizer step keeps parameter statistics for 40 ms (in the step, timed by its hooks); rank 0 waits."""
    rank = start()
    x_all, y_all = torch.randn(4096, 128), torch.randint(0, 10, (4096,))
    model = nn.parallel.DistributedDataParallel(mlp(width=256, features=128))
    gputop.watch(model)
    opt = BookkeepingSGD(model.parameters(), keep_for_s=0.04 if rank == 1 else 0.0, lr=0.01)
    deadline, steps = Deadline(seconds), 0
    loader = DataLoader(torch.utils.data.TensorDataset(x_all, y_all), batch_size=64, shuffle=True)
    while True:
        for x, y in gputop.track(loader):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            steps += 1
            if deadline.reached(steps):
                finish(rank, steps)
                return


def allocation_threads_oversubscribed(seconds: float) -> None:
    """torch.set_num_threads(3) in each of 2 ranks on a 2-core machine: 6 compute threads for 2 cores."""
    rank = start(threads=3)
    net = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 16 * 16, 10),
    )  # fmt: skip
    model = nn.parallel.DistributedDataParallel(net)
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    deadline, steps = Deadline(seconds), 0
    while not deadline.reached(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        gputop.step()  # no loader: the step is marked by hand
        steps += 1
    finish(rank, steps)


class Augmented(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A CPU-heavy per-sample augmentation: a spectral blur, applied a few times."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = torch.randn(3, 96, 96)
        for _ in range(6):
            spectrum = torch.fft.rfft2(image)
            image = torch.fft.irfft2(spectrum * 0.9, s=image.shape[-2:])
        return image[:, ::3, ::3].contiguous(), torch.tensor(index % 10)


def allocation_workers_cpu_transform(seconds: float) -> None:
    """2 DataLoader workers per rank, each running a CPU-heavy augmentation: 6 busy processes on 2 cores."""
    rank = start()
    data = Augmented()
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data), num_workers=2, persistent_workers=True)
    net = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 512), nn.ReLU(), nn.Linear(512, 10))
    model = nn.parallel.DistributedDataParallel(net)
    gputop.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    deadline, steps = Deadline(seconds), 0
    for x, y in gputop.track(loader):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        steps += 1
        if deadline.reached(steps):
            break
    finish(rank, steps)
