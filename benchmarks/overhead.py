"""What gputop costs a training process.

Four measurements, each printed with what was measured:

1. the training-thread work per step (a step mark, a tracked-loader fetch),
   against the same loop without gputop;
2. a real ``optimizer.step()`` with and without gputop's global post-hook;
3. what DDP's own timing costs per iteration on the CPU, timed every iteration
   (gputop's CPU default) vs every 100th (PyTorch's default), in a 1-rank gloo
   group;
4. a real 2-rank torchrun (gloo) job's training-loop time, gputop disabled vs
   enabled with a collector listening vs enabled with nobody listening,
   alternated over several rounds.

Run: .venv/bin/python benchmarks/overhead.py [--rounds 3] [--steps 300]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

from gputop.address import Address
from gputop.collect.server import Collector
from gputop.collect.store import Store
from gputop.reporter.clock import StepClock, TrackedLoader


def per_call_ns(fn, n: int) -> float:
    start = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - start) / n


def micro(n: int = 200_000) -> None:
    clock = StepClock()
    items = list(range(n))

    def plain(k: int) -> None:
        for _ in items[:k]:
            pass

    def tracked(k: int) -> None:
        for _ in TrackedLoader(items[:k], clock):
            pass

    def marks(k: int) -> None:
        # The pending deque is bounded (maxlen), so appends stay O(1) with no drain in the
        # loop: draining is the reporter thread's work, not the training thread's.
        for _ in range(k):
            clock.mark_step()

    base = min(per_call_ns(plain, n) for _ in range(5))
    track = min(per_call_ns(tracked, n) for _ in range(5))
    mark = min(per_call_ns(marks, n) for _ in range(5))
    print(f"tracked loader fetch: +{track - base:.0f} ns per batch (plain loop {base:.0f} ns, tracked {track:.0f} ns)")
    print(f"step mark: {mark:.0f} ns per step")


def optimizer_step(n: int = 20_000) -> None:
    import torch

    import gputop

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)

    x = torch.randn(2, 8)

    def steps(k: int) -> None:
        for _ in range(k):
            opt.step()

    def forwards(k: int) -> None:  # autograd on: the forward post-hook notes when each one ends
        for _ in range(k):
            model(x)

    before = min(per_call_ns(steps, n) for _ in range(5))
    forward_before = min(per_call_ns(forwards, n) for _ in range(5))
    os.environ["GPUTOP_PORT"] = "1"  # nobody listens: the reporter keeps a backlog
    gputop.watch(model)
    after = min(per_call_ns(steps, n) for _ in range(5))
    forward_after = min(per_call_ns(forwards, n) for _ in range(5))
    print(f"optimizer.step() on Linear(8, 8): {before / 1000:.2f} us without, {after / 1000:.2f} us with gputop "
          f"(+{(after - before) / 1000:.2f} us per step)")  # fmt: skip
    print(f"a training forward of Linear(8, 8): {forward_before / 1000:.2f} us without, "
          f"{forward_after / 1000:.2f} us with gputop's forward pre- and post-hooks "
          f"(+{(forward_after - forward_before) / 1000:.2f} us per forward)")  # fmt: skip


def ddp_timing_cost(iterations: int = 3000) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.set_num_threads(1)
    layers = [torch.nn.Linear(64, 64) for _ in range(8)]
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers))
    x = torch.randn(8, 64)

    def iterations_us(rate: int) -> float:
        model._set_ddp_runtime_logging_sample_rate(rate)
        start = time.perf_counter()
        for _ in range(iterations):
            model(x).sum().backward()
        return (time.perf_counter() - start) / iterations * 1e6

    iterations_us(1)  # warm up
    every, hundredth = [], []
    for _ in range(5):
        every.append(iterations_us(1))
        hundredth.append(iterations_us(100))
    dist.destroy_process_group()
    a, b = statistics.median(every), statistics.median(hundredth)
    print(f"DDP iteration (8x Linear(64, 64), batch 8, 1-rank gloo): {a:.1f} us timed every iteration, "
          f"{b:.1f} us every 100th ({a - b:+.1f} us per iteration)")  # fmt: skip


def ddp_loop_s(steps: int, env: dict[str, str]) -> float:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
           "gputop.demos.train", "--scenario", "healthy", "--steps", str(steps)]  # fmt: skip
    out = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, check=True).stdout
    times = [float(t) for t in re.findall(r"steps in ([0-9.]+) s", out)]
    return max(times)


def end_to_end(rounds: int, steps: int) -> None:
    collector = Collector(Store(), Address(port=0))
    collector.start()
    port = str(collector.address.port)
    modes = {
        "disabled": {"GPUTOP_DISABLE": "1"},
        "dashboard listening": {"GPUTOP_PORT": port},
        "nobody listening": {"GPUTOP_PORT": "1"},
        "listening, DDP rate 100": {"GPUTOP_PORT": port, "GPUTOP_DDP_SAMPLE_RATE": "100"},
    }
    results: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(rounds):
        for mode, env in modes.items():
            results[mode].append(ddp_loop_s(steps, env) / steps * 1000)
    collector.stop()
    base = statistics.median(results["disabled"])
    print(f"2-rank gloo DDP, healthy demo, {steps} steps x {rounds} rounds (median ms per step):")
    for mode, values in results.items():
        med = statistics.median(values)
        spread = f"{min(values):.2f}-{max(values):.2f}"
        print(f"  {mode:24s} {med:7.2f} ms/step  (range {spread})  {100 * (med - base) / base:+.1f}% vs disabled")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--skip-ddp", action="store_true")
    args = parser.parse_args()
    micro()
    optimizer_step()
    ddp_timing_cost()
    if not args.skip_ddp:
        end_to_end(args.rounds, args.steps)


if __name__ == "__main__":
    main()
