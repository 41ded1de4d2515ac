"""What the node sampler costs the rank that starts it, and what it costs its host.

Three figures (docs/performance.md):

1. The start, on the reporter thread: the wall time of ``NodeSamplerChild.start()``
   (one ``fork+exec`` through subprocess) in a process that has imported torch and
   built a model, like a rank; repeated ``--starts`` times, each child stopped again.
2. The training thread meanwhile: a thread doing step marks (``perf_counter`` and a
   deque append in a loop) records every gap between two marks; the longest gap
   overlapping each start, against the longest in an interval as long 50 ms later
   (nothing starting): what the start takes from the training thread (GIL, fork).
3. The sampler itself at 1 Hz: ``python -m gputop.node`` reading ``--gpus`` GPUs through the
   real nvidia-ml-py over the stand-in libnvidia-ml (tests/support/nvml_standin, two processes each)
   and sending to a real collector over TCP
   with a token: its CPU time over ``--seconds`` (after its start-up), RSS, and the
   bytes it sends a second.  No GPU here: real NVML calls cost more (a PCIe read is
   ~20 ms on some drivers; see benchmarks/gpu_check.py), the rest is the same.

Run: .venv/bin/python benchmarks/node_sampler.py [--starts 20] [--seconds 60] [--gpus 8]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from gputop import auth
from gputop.address import Address
from gputop.collect.server import Collector
from gputop.collect.store import Store
from gputop.reporter.node_sampler import NodeSamplerChild

REPO = Path(__file__).resolve().parents[1]
TOKEN = "benchmark"
PORT = 32400


def fake_env(gpus: int) -> dict[str, str]:
    """The stand-in libnvidia-ml with ``gpus`` H100s, two processes each, for the real nvidia-ml-py."""
    sys.path.insert(0, str(REPO))
    from tests.support.nvml_standin import Process, env_for, h100_node

    node = h100_node(gpus)
    for i, gpu in enumerate(node.gpus):
        gpu.processes = [Process(pid=1000 + i), Process(pid=2000 + i)]
    scenario = node.write(Path(tempfile.mkdtemp(prefix="gputop-bench-")) / "nvml-scenario")
    return {**os.environ, "PYTHONPATH": str(REPO), **env_for(scenario), "GPUTOP_TOKEN": TOKEN}


GAP_S = 0.0005  # mark-to-mark gaps longer than this are kept (a free loop marks every ~0.3 us)


def mark_gaps(stop: threading.Event, gaps: list[tuple[float, float]]) -> None:
    """A training thread's step marks in a loop; every gap over GAP_S as (end, length)."""
    marks: collections.deque[float] = collections.deque(maxlen=1000)
    last = time.perf_counter()
    while not stop.is_set():
        now = time.perf_counter()
        marks.append(now)
        if now - last > GAP_S:
            gaps.append((now, now - last))
        last = now


def longest_overlap_s(gaps: list[tuple[float, float]], t0: float, t1: float) -> float:
    """The longest gap in the marks that overlaps [t0, t1]: how long the training thread was held then."""
    return max((g for end, g in gaps if end >= t0 and end - g <= t1), default=0.0)


def starts(address: Address, count: int, env: dict[str, str]) -> tuple[list[float], list[float], list[float]]:
    """Start and stop the sampler ``count`` times while a thread marks steps.

    Returns the start times, the marking thread's longest gap overlapping each start,
    and its longest gap in an interval as long, 50 ms later, when nothing starts.
    """
    os.environ.update(env)  # the child inherits the rank's environment, as in a rank
    import torch  # a rank has torch loaded: a bigger process to fork

    model = torch.nn.Sequential(*(torch.nn.Linear(512, 512) for _ in range(8)))
    gaps: list[tuple[float, float]] = []
    stop = threading.Event()
    marker = threading.Thread(target=mark_gaps, args=(stop, gaps))
    marker.start()
    intervals: list[tuple[float, float]] = []
    for _ in range(count):
        child = NodeSamplerChild()
        t0 = time.perf_counter()
        child.start(address, os.getpid())
        intervals.append((t0, time.perf_counter()))
        time.sleep(0.2)
        assert child.process is not None
        child.stop()
        child.process.wait(5)
        time.sleep(0.1)
    stop.set()
    marker.join()
    del model
    spawn_s = [t1 - t0 for t0, t1 in intervals]
    during = [longest_overlap_s(gaps, t0, t1) for t0, t1 in intervals]
    quiet = [longest_overlap_s(gaps, t0 + 0.05, t1 + 0.05) for t0, t1 in intervals]
    return spawn_s, during, quiet


def steady(address: Address, seconds: float, env: dict[str, str]) -> dict[str, float]:
    """The sampler at 1 Hz for ``seconds`` after a 5-s start: CPU %, RSS, and its start-up CPU."""
    process = subprocess.Popen([sys.executable, "-m", "gputop.node", "--addr", f"127.0.0.1:{address.port}"], env=env)
    try:
        watched = psutil.Process(process.pid)
        time.sleep(5.0)
        start_cpu = watched.cpu_times()
        startup_cpu_s = start_cpu.user + start_cpu.system
        t0 = time.monotonic()
        time.sleep(seconds)
        end_cpu = watched.cpu_times()
        elapsed = time.monotonic() - t0
        rss = watched.memory_info().rss
    finally:
        process.terminate()
        process.wait(10)
    used = (end_cpu.user + end_cpu.system) - startup_cpu_s
    return {"cpu_pct": 100 * used / elapsed, "startup_cpu_s": startup_cpu_s, "rss_mib": rss / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()

    store = Store()
    collector = Collector(store, Address(host="127.0.0.1", port=PORT), security=auth.Security(token=TOKEN))
    collector.start()
    env = fake_env(args.gpus)
    try:
        result = steady(collector.address, args.seconds, env)
        history = store.snapshot(time.time()).node_gpu_history
        samples = sum(len(h) for h in history.values())
        spawn_s, during_s, quiet_s = starts(collector.address, args.starts, env)
    finally:
        collector.stop()
    from gputop.model.samples import gpu_sample_to_wire
    from gputop.node.sampler import gpus_frame

    last = next(iter(history.values()))[-1]
    frame_bytes = len(gpus_frame(last, "node"))
    assert gpu_sample_to_wire(last)  # the sample that arrived is what a node sends
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(
        f"start on the reporter thread ({len(spawn_s)} starts): median {statistics.median(spawn_s) * 1e3:.1f} ms, "
        f"max {max(spawn_s) * 1e3:.1f} ms"
    )
    print(
        "training thread's longest gap between step marks, median / max over the starts: "
        f"{statistics.median(during_s) * 1e3:.2f} / {max(during_s) * 1e3:.2f} ms during a start, "
        f"{statistics.median(quiet_s) * 1e3:.2f} / {max(quiet_s) * 1e3:.2f} ms in as long an interval without one"
    )
    print(
        f"sampler at 1 Hz, {args.gpus} fake GPUs x 2 processes, {args.seconds:.0f} s: "
        f"CPU {result['cpu_pct']:.2f}% of a core, RSS {result['rss_mib']:.0f} MiB, "
        f"start-up CPU {result['startup_cpu_s']:.2f} s; {samples} samples arrived; "
        f"{frame_bytes} bytes a frame ({frame_bytes} B/s)"
    )


if __name__ == "__main__":
    main()
