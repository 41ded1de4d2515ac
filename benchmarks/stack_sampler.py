"""What sampling the training thread's stack costs (issue #22's target: at most 0.1% of a core per rank).

Three measurements:

1. one sample of a training thread 40 frames deep (``StackSampler.sample``, the
   reporter thread's work): back to back (warm caches), and paced every 50 ms
   as at 20/s, where the sampling thread's CPU from before its sleep to after
   the sample (what the sampler's budget counts) is mostly the wake-up; with
   the training thread blocked and with it busy in Python (holding the GIL);
2. real ranks: a training script 40 frames deep stepping in a loop of tiny
   steps (~1 ms of pure Python each, ``gputop.step()`` after each: the training
   thread holds the GIL, so every sample takes it away) reports to a
   real collector in this process, once with ``GPUTOP_STACKS=0`` and once at the
   default 20 samples a second, alternated over several rounds.  From each run,
   its reporter thread's CPU (the windows' ``reporter_cpu_s``: the sampler runs
   on that thread, so the difference is the sampler's, wake-ups included) and
   the steps per second of the training loop, median of the rounds;
3. the same at 200 samples a second, to show the cost scales with the rate.

Run: .venv/bin/python benchmarks/stack_sampler.py [--rounds 5] [--seconds 8]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

from gputop.address import Address
from gputop.collect.server import Collector
from gputop.collect.store import Store
from gputop.reporter.stacks import StackSampler

DEPTH = 40

RANK_SCRIPT = """
import sys, time, gputop

seconds, depth = float(sys.argv[1]), int(sys.argv[2])
gputop.watch()


def tiny_step():
    total = 0
    for k in range(30_000):  # ~1 ms of pure Python: the training thread holds the GIL, the worst case for a sampler
        total += k * k
    return total


def train(until):
    steps = 0
    measured_from = time.monotonic() + 2.0  # the reporter has connected and the collector answered by then
    counted = 0
    while (now := time.monotonic()) < until:
        tiny_step()
        gputop.step()
        if now >= measured_from:
            counted += 1
    print(f"steps_per_s {counted / (until - measured_from):.1f}", flush=True)


def deep(left, until):
    if left == 0:
        return train(until)
    return deep(left - 1, until)


deep(depth, time.monotonic() + seconds)
"""


def one_sample(busy: bool, gap_s: float, samples: int) -> tuple[float, float]:
    """(median CPU µs, median wall µs) of one sample of a thread DEPTH frames deep, blocked or busy in Python.

    ``gap_s`` between samples: 0 back to back (caches warm), 0.05 as the reporter
    thread samples at 20/s (it sleeps between samples and wakes with cold caches).
    """
    stop = threading.Event()

    def blocked(left: int) -> None:
        if left:
            return blocked(left - 1)
        stop.wait()

    def spinning(left: int) -> None:
        if left:
            return spinning(left - 1)
        while not stop.is_set():
            sum(range(100))

    thread = threading.Thread(target=spinning if busy else blocked, args=(DEPTH,), daemon=True)
    thread.start()
    time.sleep(0.2)
    sampler = StackSampler(thread.ident or 0)
    walls, cpus = [], []
    sleep = threading.Lock()  # the reporter thread sleeps on a held lock, with a timeout
    sleep.acquire()
    for _ in range(samples):
        cpu = time.thread_time()  # before the sleep: the wake is part of a paced sample's cost, as the reporter counts
        if gap_s:
            sleep.acquire(timeout=gap_s)
        start = time.perf_counter()
        sampler.sample()
        walls.append(time.perf_counter() - start)
        cpus.append(time.thread_time() - cpu)
    stop.set()
    thread.join()
    return statistics.median(cpus) * 1e6, statistics.median(walls) * 1e6


def run_rank(script: Path, collector: Collector, seconds: float, **env: str) -> tuple[float, float, float, float]:
    """(steps/s, reporter thread CPU % of a core, stack samples a second, the settled interval in ms) of one run."""
    full = {**os.environ, "GPUTOP_PORT": str(collector.address.port), "GPUTOP_RUN_ID": f"bench-{time.time_ns()}", **env}
    out = subprocess.run([sys.executable, str(script), str(seconds), str(DEPTH)], env=full, capture_output=True,
                         text=True, timeout=seconds + 60, check=True).stdout  # fmt: skip
    steps_per_s = float(out.split("steps_per_s ")[1].split()[0])
    time.sleep(0.5)
    view = next(v for v in collector.store.snapshot(time.time()).all_ranks() if v.run_id == full["GPUTOP_RUN_ID"])
    windows = [w for w in view.windows if w.reporter_cpu_s is not None][2:]  # after start-up and calibration
    cpu_pct = 100 * sum(w.reporter_cpu_s or 0.0 for w in windows) / sum(w.duration_s for w in windows)
    settled = view.stacks[2:]  # the rate has adapted after a second or two
    rate = sum(s.samples for s in settled) / sum(s.period_s for s in settled) if settled else 0.0
    return steps_per_s, cpu_pct, rate, (settled[-1].interval_s * 1e3 if settled else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")

    print(f"one sample of a thread {DEPTH} frames deep, medians (CPU: of the sampling thread, its wake included):")
    for busy in (False, True):
        for gap_s, samples in ((0.0, 2000), (0.05, 200)):
            cpu_us, wall_us = one_sample(busy, gap_s, samples)
            state = "busy in Python" if busy else "blocked"
            pace = "every 50 ms (as at 20/s)" if gap_s else "back to back"
            print(f"  {state:>14}, {pace:>24}: CPU {cpu_us:5.1f} µs (sample alone: wall {wall_us:5.1f} µs)"
                  f" = {cpu_us * 20 / 1e4:.3f}% of a core at 20/s")  # fmt: skip

    collector = Collector(Store(), Address(port=0))
    collector.start()
    results: dict[str, list[tuple[float, float, float, float]]] = {"off": [], "20/s": [], "200/s": []}
    settings = {"off": {"GPUTOP_STACKS": "0"}, "20/s": {}, "200/s": {"GPUTOP_STACKS_HZ": "200"}}
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "tiny_steps.py"
        script.write_text(textwrap.dedent(RANK_SCRIPT))
        for _ in range(args.rounds):
            for name, env in settings.items():  # alternated: a drift in the machine's load hits each alike
                results[name].append(run_rank(script, collector, args.seconds, **env))
    collector.stop()

    rounds = f"{args.rounds} rounds of {args.seconds:g} s"
    print(f"\nreal rank, {DEPTH} frames deep, ~1-ms pure-Python steps, {rounds}; medians, and of each round's")
    print("difference from the round's run with stacks off (the runs of a round are back to back):")
    off = results["off"]
    for name, runs in results.items():
        steps = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        d_steps = statistics.median(100 * (r[0] / o[0] - 1) for r, o in zip(runs, off, strict=True))
        d_cpu = statistics.median(r[1] - o[1] for r, o in zip(runs, off, strict=True))
        rate = statistics.median(r[2] for r in runs)
        interval = statistics.median(r[3] for r in runs)
        print(f"  stacks {name:>5}: {steps:6.0f} steps/s ({d_steps:+.1f}%), reporter thread {cpu:.3f}% of a core "
              f"({d_cpu:+.3f}), {rate:4.1f} samples/s (settled interval {interval:.0f} ms)")  # fmt: skip
    for index, label in ((0, "steps/s"), (1, "reporter thread % of a core")):
        print(f"  per round, {label}:", {name: [round(r[index], 3) for r in runs] for name, runs in results.items()})


if __name__ == "__main__":
    main()
