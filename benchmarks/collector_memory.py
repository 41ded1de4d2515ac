"""The collector alone at N socket ranks: its thread's CPU and the process's RSS over time, no dashboard.

A real ``Collector`` and ``Store`` (what ``gputop attach`` runs, without the
samplers and the UI) on a loopback port, fed by ``benchmarks/tui.py``'s
synthetic ranks (a child process, one TCP connection per rank, a window per
rank every 0.5 s).  Every ``--every`` seconds it prints the process's RSS, the
collector thread's CPU over the interval, and glibc's view of its heap
(``mallinfo2``: bytes in use and bytes free but kept).  ``--trim`` calls
``malloc_trim(0)`` after each reading and prints the RSS after it: a
diagnostic, to tell memory the program holds from memory glibc keeps.

In ``gputop attach`` the UI threads free blocks larger than 256 KiB, and glibc
then raises its mmap threshold above that size, so larger allocations come from
its heaps.  ``MALLOC_MMAP_THRESHOLD_=524288`` in the environment does the same
here: the condition under which the collector's "free in heap" grew with every
read while it used asyncio's streams (a 256-KiB ``recv`` buffer per read).

Run: .venv/bin/python benchmarks/collector_memory.py --ranks 1024 [--seconds 360] [--every 30] [--trim]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import multiprocessing
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

from gputop.address import Address
from gputop.collect.server import Collector
from gputop.collect.store import Store

MIB = 2**20
CLK_TCK = os.sysconf("SC_CLK_TCK")


class _Mallinfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 on), summed over every arena."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = _Mallinfo2


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pymalloc_mib() -> tuple[float, float]:
    """Python's small-object allocator: (MiB of its arenas, MiB in live blocks), from ``sys._debugmallocstats``.

    pymalloc takes its 1-MiB arenas from mmap, not malloc, so ``mallinfo2`` does not see them.
    """
    saved = os.dup(2)
    with tempfile.TemporaryFile() as out:
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode()
    arenas = re.search(r"# arenas allocated current\s*=\s*([\d,]+)", text)
    live = re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", text)
    assert arenas is not None and live is not None
    return int(arenas.group(1).replace(",", "")) * 1.0, int(live.group(1).replace(",", "")) / MIB


def thread_cpu_s(tid: int) -> float:
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def send_windows(port: int, ranks: int) -> None:
    """The child process: ``benchmarks/tui.py``'s ranks (imported by path: benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location("benchmarks_tui", Path(__file__).with_name("tui.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.run_ranks(port, ranks)


def reading(elapsed_s: float, collector_pct: float, store: Store, trim: bool) -> str:
    """One line: RSS, the collector's CPU, glibc's heap (in use, free but kept), pymalloc's arenas."""
    info = _libc.mallinfo2()
    arenas_mib, live_mib = pymalloc_mib()
    windows = sum(len(rank.windows) for rank in store._ranks.values())  # a snapshot would decode them all
    line = (
        f"{elapsed_s:5.0f} s: RSS {rss_mib():6.1f} MiB, collector {collector_pct:4.1f}%"
        f", heap in use {info.uordblks / MIB:6.1f} MiB, free in heap {info.fordblks / MIB:6.1f} MiB"
        f", mmapped {info.hblkhd / MIB:5.1f} MiB, pymalloc arenas {arenas_mib:6.1f} MiB, live {live_mib:6.1f} MiB"
        f", {windows} windows, load {os.getloadavg()[0]:.2f}"
    )
    if trim:
        _libc.malloc_trim(0)
        line += f"; after malloc_trim {rss_mib():6.1f} MiB"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=360.0)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between readings")
    parser.add_argument("--trim", action="store_true", help="malloc_trim(0) after each reading (a diagnostic)")
    args = parser.parse_args()
    store = Store()
    collector = Collector(store, Address(port=0))
    collector.start()
    thread = next(t for t in threading.enumerate() if t.name == "gputop-collector")
    assert thread.native_id is not None and collector.address.port is not None
    sender = multiprocessing.get_context("spawn").Process(
        target=send_windows, args=(collector.address.port, args.ranks), daemon=True
    )
    sender.start()
    t0 = time.perf_counter()
    cpu0 = thread_cpu_s(thread.native_id)
    print(f"{args.ranks} ranks into a collector on port {collector.address.port}; load {os.getloadavg()[0]:.2f}")
    try:
        while time.perf_counter() - t0 < args.seconds:
            time.sleep(args.every)
            cpu1 = thread_cpu_s(thread.native_id)
            print(reading(time.perf_counter() - t0, 100 * (cpu1 - cpu0) / args.every, store, args.trim), flush=True)
            cpu0 = cpu1
    finally:
        sender.kill()
        collector.stop()


if __name__ == "__main__":
    sys.exit(main())
