"""A small DDP job for the integration tests: known step count, known loader delay."""

from __future__ import annotations

import argparse
import os
import random
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

import gputop
from gputop.demos.teardown import exit_without_teardown


class SleepyData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Each batch costs a known delay (one sample per batch sleeps)."""

    def __init__(self, delay_s: float, batch_size: int, transform_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.batch_size = batch_size
        self.transform_s = transform_s

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s and index % self.batch_size == 0:
            time.sleep(self.delay_s)
        if self.transform_s:  # a CPU-heavy per-sample transform (decode, augment): it spins, it does not sleep
            until = time.thread_time() + self.transform_s
            while time.thread_time() < until:
                pass
        return torch.ones(64) * (index % 7), torch.tensor(index % 10)


def compute_metrics(seconds: float) -> float:
    """A metric in plain Python (sorting scores, a log-loss), the way an epoch metric recomputed each step is."""
    scores = [((k * 7919) % 1000) / 1000.0 for k in range(4096)]
    end, total = time.perf_counter() + seconds, 0.0
    while time.perf_counter() < end:
        ranked = sorted(scores, reverse=True)
        total += sum(s * s for s in ranked[:512])
    return total


def loss_statistics(logits: torch.Tensor, seconds: float) -> float:
    """A per-batch statistic of the outputs in plain Python, between the forward and ``loss.backward()`` (a
    calibration score, a log line's histogram): the script's work, not the model's backward.  One plain loop, no
    generator, so the stack samples find it in this one function."""
    scores = [((k * 7919) % 1000) / 1000.0 for k in range(4096)]
    end, total = time.perf_counter() + seconds, float(logits.detach().sum())
    while time.perf_counter() < end:
        ranked = sorted(scores, reverse=True)
        for score in ranked[:512]:
            total += score * score
    return total


def metric_all_reduce(steps: int, skip_at: int, mismatch_at: int, int_at: int = 0) -> None:
    """A metric averaged over the ranks for the log, every step; on rank 1 skipped (a branch on the rank that
    skips it), of another size (a tensor whose shape differs on one rank) or an int32 of the same size (a count
    where the others send a mean: gloo sums the bytes and goes on) after the steps asked for."""
    rank = dist.get_rank()
    if skip_at and steps == skip_at and rank == 1:
        return  # rank 1 goes on into the next step: its #N is DDP's all-reduce, rank 0's this one
    dtype = torch.int32 if int_at and steps == int_at and rank == 1 else torch.float32
    metric = torch.full((2 if mismatch_at and steps == mismatch_at and rank == 1 else 1,), steps, dtype=dtype)
    dist.all_reduce(metric)  # the metric's all-reduce


class ClippingSGD(torch.optim.SGD):
    """SGD whose step also does per-parameter bookkeeping in Python (``extra_s`` of it): an optimizer that is slow."""

    def __init__(self, params: object, lr: float, extra_s: float = 0.0) -> None:
        super().__init__(params, lr=lr)  # type: ignore[arg-type]
        self.extra_s = extra_s

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        if self.extra_s:
            compute_metrics(self.extra_s)
        super().step()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--no-watch", action="store_true")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--stall-every", type=int, default=0, help="after every Nth step, one rank stops")
    parser.add_argument("--stall-ms", type=float, default=400.0, help="how long it stops (a checkpoint save)")
    parser.add_argument("--stall-rank", type=int, default=0)
    parser.add_argument("--hang-at", type=int, default=0, help="rank 1 blocks on a lock after this step")
    parser.add_argument("--hang-rank", type=int, default=1, help="the rank that blocks (--hang-at)")
    parser.add_argument(
        "--metric-all-reduce", action="store_true", help="after each step every rank all-reduces a metric for the log"
    )
    parser.add_argument("--skip-at", type=int, default=0, help="after this step rank 1 skips the metric's all-reduce")
    parser.add_argument("--mismatch-at", type=int, default=0, help="after this step rank 1's metric has 2 elements")
    parser.add_argument("--int-at", type=int, default=0, help="after this step rank 1's metric is an int32: same size")
    parser.add_argument("--hang-s", type=float, default=20.0, help="for this long; then the job carries on")
    parser.add_argument("--fail-at", type=int, default=0, help="rank 1 raises RuntimeError after this step")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--find-unused", action="store_true", help="DDP(find_unused_parameters=True): none are unused")
    parser.add_argument("--transform-ms", type=float, default=0.0, help="CPU time each sample's transform burns")
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step (no_sync)")
    parser.add_argument("--metric-ms", type=float, default=0.0, help="a Python metric this long after each step")
    parser.add_argument(
        "--metric-rank", type=int, default=1, help="the rank that computes it; -1: a rank drawn at random each step"
    )
    parser.add_argument("--optimizer-ms", type=float, default=0.0, help="rank 1's optimizer step takes this longer")
    parser.add_argument(
        "--pre-backward-ms", type=float, default=0.0, help="Python work this long between the forward and backward()"
    )
    parser.add_argument("--pre-backward-rank", type=int, default=1, help="the rank that does it")
    parser.add_argument(
        "--manual", choices=("before", "after"), help="also call gputop.step() before or after optimizer.step()"
    )
    parser.add_argument("--loss-all-reduce", action="store_true", help="average the loss over the ranks each step")
    parser.add_argument("--comm-hook", action="store_true", help="DDP's exchange through torch's Python allreduce_hook")
    parser.add_argument(
        "--stop-file", help="every 20 steps the ranks agree (one all-reduce) whether this file exists; then stop"
    )
    args = parser.parse_args()

    dist.init_process_group("gloo")
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10)),
        find_unused_parameters=args.find_unused,
    )
    if args.comm_hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, default_hooks.allreduce_hook)  # dist.all_reduce from Python: the tap sees it
    if not args.no_watch:
        reporter = gputop.watch(model)
        fake_uuids = os.environ.get("TEST_FAKE_DEVICE_UUIDS")
        if reporter is not None and fake_uuids:
            # No GPU here: the stand-in libnvidia-ml (tests/support/nvml_standin) lists these UUIDs, and each
            # local rank claims one as its device, as torch.cuda would tell a rank on a real GPU.
            reporter.side.facts["device_uuid"] = fake_uuids.split(",")[int(os.environ.get("LOCAL_RANK", "0"))]
            reporter.side.facts_changed.set()
    world = dist.get_world_size()
    slow_optimizer_s = args.optimizer_ms / 1000.0 if dist.get_rank() == 1 else 0.0
    optimizer = ClippingSGD(model.parameters(), lr=0.01, extra_s=slow_optimizer_s)
    loader = DataLoader(
        SleepyData(args.delay_ms / 1000.0, args.batch_size, args.transform_ms / 1000.0),
        batch_size=args.batch_size,
        num_workers=args.workers,
    )
    steps = micro = 0
    for x, y in gputop.track(loader):
        micro += 1
        if micro % args.accumulate:  # gradient accumulation: no all-reduce until the last micro-batch
            with model.no_sync():
                nn.functional.cross_entropy(model(x), y).backward()
            continue
        logits = model(x)
        if args.pre_backward_ms and dist.get_rank() == args.pre_backward_rank:
            loss_statistics(logits, args.pre_backward_ms / 1000.0)  # the others wait for it in the all-reduce
        loss = nn.functional.cross_entropy(logits, y)
        loss.backward()
        if args.loss_all_reduce:  # the global loss for the log, as many scripts average it
            logged = loss.detach().clone()
            dist.all_reduce(logged)
        if args.manual == "before":
            gputop.step()
        optimizer.step()
        if args.manual == "after":
            gputop.step()
        optimizer.zero_grad()
        # After the optimizer step, on one rank: the others wait.  Drawn each step (the same draw on every
        # rank), it is the rank whose batch came out longest, whose shard holds the sample to log, …
        metric_rank = args.metric_rank if args.metric_rank >= 0 else random.Random(steps).randrange(world)
        if args.metric_ms and dist.get_rank() == metric_rank:
            compute_metrics(args.metric_ms / 1000.0)
        steps += 1
        if args.stall_every and steps % args.stall_every == 0 and dist.get_rank() == args.stall_rank:
            time.sleep(args.stall_ms / 1000.0)  # a checkpoint save on one rank: the others wait in the next all-reduce
        if args.fail_at and steps == args.fail_at and dist.get_rank() == 1:
            raise RuntimeError(f"rank 1 fails at step {steps}")
        if args.hang_at and steps == args.hang_at and dist.get_rank() == args.hang_rank:
            stuck = threading.Lock()  # a lock someone else holds
            stuck.acquire()
            stuck.acquire(timeout=args.hang_s)  # blocked, no CPU; rank 0 waits in its next all-reduce
        if args.metric_all_reduce:
            metric_all_reduce(steps, args.skip_at, args.mismatch_at, args.int_at)
        if steps == args.steps:
            break
        if args.stop_file and steps % 20 == 0:  # together: a rank that left alone would hang the other
            stop = torch.tensor([float(os.path.exists(args.stop_file))])
            dist.all_reduce(stop)
            if stop.item() > 0:
                break
    print(f"rank {dist.get_rank()} steps {steps}", flush=True)
    ddp = model._get_ddp_logging_data()  # DDP's own running average, for the test to check gputop's against
    print(f"rank {dist.get_rank()} ddp {ddp.get('iteration')} {ddp.get('avg_forward_compute_time')}", flush=True)
    dist.barrier()  # no rank tears gloo down while another is still in a collective
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()  # gloo aborts now and then in the interpreter's teardown
