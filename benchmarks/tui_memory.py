"""Where the dashboard's memory goes at N ranks, and whether it stays flat once every history is full.

Builds a real ``Store`` of N synthetic ranks with ``--history`` seconds of
windows (``benchmarks/tui_profile.py``'s), then runs the app under Textual's
pilot at 160x48 for ``--seconds``, a window per rank every 0.5 s, printing the
process's RSS every ``--every`` seconds.  With ``--trace`` it also runs
tracemalloc from before the store is filled and prints, at the end, the live
bytes by consumer (the store's windows, past views, the rest) and the top
allocation sites; tracemalloc costs time and memory of its own, so read RSS
from a run without it.

Run: .venv/bin/python benchmarks/tui_memory.py --ranks 1024 [--history 200] [--seconds 60] [--trace]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
import tracemalloc
from pathlib import Path

import msgspec

from gputop.collect.store import Store
from gputop.diagnose import Diagnoser
from gputop.tui.app import GputopApp

MIB = 2**20


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _deep_size(roots: list[object], seen: set[int]) -> int:
    """Bytes of the objects reachable from ``roots`` not already in ``seen`` (which it extends)."""
    total = 0
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, msgspec.Struct):  # windows are gc=False: the collector cannot list their fields
            stack.extend(getattr(obj, name) for name in obj.__struct_fields__)
        else:
            stack.extend(gc.get_referents(obj))
    return total


def consumers(app: GputopApp, store: Store) -> None:
    """Bytes held by the store's windows, then what the views add on top, each counted once."""
    seen: set[int] = {id(module) for module in sys.modules.values()}  # code and classes: not data
    histories = [state.windows for state in store._ranks.values()]
    objects = [w for h in histories for w in h._newest]
    encoded = [blob for h in histories for blob in h._older]
    sizes = {
        f"store: {len(objects)} windows as objects": _deep_size([objects], seen) - sys.getsizeof(objects),
        f"store: {len(encoded)} windows encoded": _deep_size([encoded], seen) - sys.getsizeof(encoded),
        "store: the rest": _deep_size([store], seen),
        "the view on screen, beyond the store": _deep_size([app._newest], seen),
        f"{len(app.past)} past views, beyond all that": _deep_size(list(app.past), seen),
    }
    for name, size in sizes.items():
        print(f"  {size / MIB:7.1f} MiB  {name}")


def top_sites(snapshot: tracemalloc.Snapshot, top: int) -> None:
    stats = snapshot.statistics("lineno")
    total = sum(s.size for s in stats)
    print(f"tracemalloc: {total / MIB:.1f} MiB live in {sum(s.count for s in stats)} blocks")
    for stat in stats[:top]:
        frame = stat.traceback[0]
        where = f"{Path(frame.filename).name}:{frame.lineno}"
        print(f"  {stat.size / MIB:7.1f} MiB {stat.count:8d} blocks  {where}")
    by_file: dict[str, int] = {}
    for stat in snapshot.statistics("filename"):
        name = stat.traceback[0].filename
        package = "gputop/" + name.split("/gputop/", 1)[1] if "/gputop/" in name else name.rsplit("/", 2)[0]
        by_file[package] = by_file.get(package, 0) + stat.size
    print("by file or package:")
    for name, size in sorted(by_file.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {size / MIB:7.1f} MiB  {name}")


async def run_app(store: Store, ranks: int, next_seq: int, seconds: float, every_s: float, trace: bool) -> None:
    from benchmarks_profile import Feeder, StoreSource

    feeder = Feeder(store, ranks, next_seq)
    app = GputopApp(StoreSource(store), refresh_s=0.5, diagnoser_factory=Diagnoser)
    t0 = time.perf_counter()
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            while app.view is None:
                await pilot.pause(0.1)
            while (elapsed := time.perf_counter() - t0) < seconds:
                await asyncio.sleep(every_s)
                print(
                    f"  {elapsed + every_s:5.0f} s: RSS {rss_mib():6.1f} MiB, {len(app.past)} past views, "
                    f"figures every {app.figures_every_s:.1f} s",
                    flush=True,
                )
            feeder.stop()
            gc.collect()
            print(f"RSS at the end {rss_mib():.1f} MiB")
            if trace:
                top_sites(tracemalloc.take_snapshot(), 25)
            consumers(app, store)
    finally:
        feeder.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--history", type=float, default=200.0, help="seconds of windows fed before the app starts")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds the app runs")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between RSS readings")
    parser.add_argument("--trace", action="store_true", help="tracemalloc: live bytes by consumer and site")
    args = parser.parse_args()
    from benchmarks_profile import fill

    print(f"RSS after imports {rss_mib():.1f} MiB", flush=True)
    if args.trace:
        tracemalloc.start()
    store = Store(listen="memory")
    next_seq = fill(store, args.ranks, args.history, time.time())
    gc.collect()
    print(f"RSS with {args.history:.0f} s of {args.ranks} ranks in the store {rss_mib():.1f} MiB", flush=True)
    asyncio.run(run_app(store, args.ranks, next_seq, args.seconds, args.every, args.trace))


if __name__ == "__main__":
    import importlib.util

    here = Path(__file__).parent
    for name, file in (("benchmarks_tui", "tui.py"), ("benchmarks_profile", "tui_profile.py")):
        spec = importlib.util.spec_from_file_location(name, here / file)
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    main()
