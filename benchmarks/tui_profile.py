"""Where a dashboard refresh's CPU goes at N ranks: the figures worker and the UI thread, by cProfile.

Builds a real ``Store`` holding N synthetic ranks (8 a host, the same windows
as ``benchmarks/tui.py``) with ``--history`` seconds of windows, then:

1. the worker's steps on one snapshot, each timed and profiled: ``snapshot()``
   (as a live source takes it), ``summarize``, the diagnoser, ``build_view``;
2. the app under Textual's pilot at 160x48 for ``--seconds``, a new window per
   rank every 0.5 s, with cProfile on the UI thread (the event loop), and a
   few ``s`` presses timed from the key to the table re-ordered.

Run: .venv/bin/python benchmarks/tui_profile.py --ranks 1024 [--history 120] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gputop.collect.store import Store
from gputop.diagnose import Diagnoser
from gputop.model.figures import summarize
from gputop.model.snapshot import SNAPSHOT_HISTORY_WINDOWS, SPAN_COPY_WINDOWS, Snapshot
from gputop.protocol import Window, decode
from gputop.tui.app import GputopApp
from gputop.tui.view import build_view

WINDOW_S = 0.5


def _window(rank: int, seq: int, now: float) -> Window:
    from benchmarks_tui import _window as encoded  # the benchmark's own window, decoded

    message = decode(encoded(rank, seq, now))
    assert isinstance(message, Window)
    return message


def fill(store: Store, ranks: int, seconds: float, now: float) -> int:
    """Hellos and ``seconds`` of windows for every rank; returns the next window's seq."""
    from benchmarks_tui import hello_of  # the benchmark's own ranks

    for rank in range(ranks):
        store.ingest(hello_of(rank, ranks), now - seconds)
    n = int(seconds / WINDOW_S)
    for seq in range(1, n + 1):
        t = now - seconds + seq * WINDOW_S
        store.ingest_many((_window(rank, seq, t) for rank in range(ranks)), t)
    return n + 1


class StoreSource:
    """A live source without sockets: the store, snapshotted as ``LiveSource`` does."""

    kind = "live"
    description = "profile"

    def __init__(self, store: Store) -> None:
        self.store = store
        self.focus: frozenset[str] = frozenset()

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def snapshot(self) -> Snapshot:
        return self.store.snapshot(
            time.time(), history=SPAN_COPY_WINDOWS, full=self.focus, full_history=SNAPSHOT_HISTORY_WINDOWS
        )

    @property
    def finished(self) -> bool:
        return False


def profiled(label: str, fn: Callable[[], Any], top: int) -> Any:
    profile = cProfile.Profile()
    t0, c0 = time.perf_counter(), time.thread_time()
    profile.enable()
    result = fn()
    profile.disable()
    print(f"{label}: {1000 * (time.perf_counter() - t0):.1f} ms wall, {1000 * (time.thread_time() - c0):.1f} ms CPU")
    if top:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(top)
        print("\n".join(out.getvalue().splitlines()[6:]))
    return result


def worker_steps(store: Store, top: int) -> None:
    source = StoreSource(store)
    diagnoser = Diagnoser()
    snapshot = profiled("snapshot()", source.snapshot, 0)
    figures = profiled("summarize", lambda: summarize(snapshot), top)
    findings = profiled("diagnose", lambda: list(diagnoser.update(figures)), top)
    profiled("build_view", lambda: build_view(figures, findings, "ok"), top)


def _thread_cpu_s(tid: int | None) -> float:
    """A thread of this process: its CPU seconds, from /proc."""
    fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Feeder:
    """The collector's part, on a thread: a window per rank every 0.5 s from ``next_seq`` on, until stopped."""

    def __init__(self, store: Store, ranks: int, next_seq: int) -> None:
        self._store, self._ranks, self._seq = store, ranks, next_seq
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._feed, daemon=True)
        self._thread.start()

    def _feed(self) -> None:
        while not self._stop.wait(WINDOW_S):
            now = time.time()
            self._store.ingest_many((_window(rank, self._seq, now) for rank in range(self._ranks)), now)
            self._seq += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


async def ui_thread(store: Store, seconds: float, next_seq: int, ranks: int, top: int, sort: str) -> None:
    feeder = Feeder(store, ranks, next_seq)
    app = GputopApp(StoreSource(store), refresh_s=0.5, diagnoser_factory=Diagnoser)
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            while app.view is None:
                await pilot.pause(0.1)
            figures_tid = app.worker.native_id
            c0, f0, t0 = time.thread_time(), _thread_cpu_s(figures_tid), time.perf_counter()
            await asyncio.sleep(seconds)
            ui_s, figures_s, wall_s = time.thread_time() - c0, _thread_cpu_s(figures_tid) - f0, time.perf_counter() - t0
            print(
                f"over {wall_s:.1f} s without the profiler: UI thread {100 * ui_s / wall_s:.1f}% of a core, "
                f"figures thread {100 * figures_s / wall_s:.1f}% (figures every {app.figures_every_s:.2f} s)"
            )
            profile = cProfile.Profile()
            c0, t0 = time.thread_time(), time.perf_counter()
            profile.enable()
            await asyncio.sleep(seconds)
            profile.disable()
            ui_s, wall_s = time.thread_time() - c0, time.perf_counter() - t0
            print(f"UI thread over {wall_s:.1f} s with cProfile: {100 * ui_s / wall_s:.1f}% of a core")
            for _ in range(5):
                before = app.main.table.sort_index
                t0 = time.perf_counter()
                await pilot.press("s")
                while app.main.table.sort_index == before:
                    await asyncio.sleep(0.001)
                await pilot.pause()
                print(f"  s handled and drawn in {1000 * (time.perf_counter() - t0):.0f} ms")
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats(sort).print_stats(top)
            print("\n".join(out.getvalue().splitlines()[6:]))
    finally:
        feeder.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--history", type=float, default=60.0, help="seconds of windows already held")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds the UI thread is profiled")
    parser.add_argument("--top", type=int, default=25, help="functions listed per profile")
    parser.add_argument("--sort", default="tottime", help="the UI profile's order: tottime or cumulative")
    args = parser.parse_args()
    store = Store(listen="profile")
    next_seq = fill(store, args.ranks, args.history, time.time())
    worker_steps(store, args.top)
    asyncio.run(ui_thread(store, args.seconds, next_seq, args.ranks, args.top, args.sort))


if __name__ == "__main__":
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("benchmarks_tui", Path(__file__).with_name("tui.py"))
    assert spec is not None and spec.loader is not None
    sys.modules["benchmarks_tui"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sys.modules["benchmarks_tui"])
    main()
