"""What the figures, one diagnosis and one per-rank summary cost on a big, long run.

64 ranks x 1200 windows (10 minutes at 0.5 s) with DDP figures and each step's
readiness (which the straggler rule compares step by step), as the report sees a
long recording; and the live case (the last 10 s).

Run: .venv/bin/python benchmarks/diagnose_cost.py [--ranks 64] [--windows 1200] [--without-readiness]
"""

from __future__ import annotations

import argparse
import time

from gputop.collect.store import Store
from gputop.diagnose import diagnose
from gputop.model.figures import summarize
from gputop.model.sums import rank_stats
from gputop.protocol import Hello, Window
from gputop.sketch import sketch_bucket

RANKS, WINDOWS = 64, 1200


def build(ranks: int, windows: int, readiness: bool) -> Store:
    store = Store(history_windows=None)
    for rank in range(ranks):
        store.ingest(Hello(run_id="big", rank=rank, world_size=ranks, loader_batch_size=32, ddp=True), 0.0)
        for seq in range(1, windows + 1):
            numbers = tuple(range(5 * seq - 4, 5 * seq + 1)) if readiness else ()
            ready = tuple(0.03 + 1e-4 * ((n * 31 + rank) % 17) for n in numbers)  # ranks ready within 1.7 ms
            store.ingest(
                Window(run_id="big", rank=rank, seq=seq, t0=seq * 0.5, t1=seq * 0.5 + 0.5, steps=5,
                       step_total=5 * seq, step_time_sum_s=0.5, step_time_p50_s=0.1, step_time_p95_s=0.12,
                       step_time_max_s=0.13, step_sketch={sketch_bucket(0.1): 5}, loader_wait_s=0.02,
                       loader_batches=5, samples=160, forward_s=0.03, backward_s=0.05, comm_s=0.02,
                       overlap_s=0.01, ddp_iteration=seq // 5 * 10, cpu_pct=100.0, rss_bytes=2**30,
                       ready_step_numbers=numbers, ready_s=ready),
                seq * 0.5 + 0.5,
            )  # fmt: skip
    return store


def best_of(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ranks", type=int, default=RANKS)
    parser.add_argument("--windows", type=int, default=WINDOWS)
    parser.add_argument("--without-readiness", action="store_true", help="windows as older reporters sent them")
    args = parser.parse_args()
    store = build(args.ranks, args.windows, not args.without_readiness)
    end = args.windows * 0.5 + 0.5
    snap = store.snapshot(end)
    print(f"{args.ranks} ranks x {args.windows} windows, {'without' if args.without_readiness else 'with'} readiness")
    print(f"  snapshot (all windows):       {best_of(lambda: store.snapshot(end)) * 1000:7.1f} ms")
    print(f"  snapshot (last 240 windows):  {best_of(lambda: store.snapshot(end, history=240)) * 1000:7.1f} ms")
    print(
        f"  rank_stats, one rank:         {best_of(lambda: rank_stats(snap.runs[0].ranks[0].windows)) * 1000:7.2f} ms"
    )
    whole, live = summarize(snap, span_s=None), summarize(snap)
    print(f"  figures, whole run:           {best_of(lambda: summarize(snap, span_s=None)) * 1000:7.1f} ms")
    print(f"  figures, live (last 10 s):    {best_of(lambda: summarize(snap)) * 1000:7.1f} ms")
    print(f"  diagnose, whole run:          {best_of(lambda: diagnose(whole)) * 1000:7.1f} ms")
    print(f"  diagnose, live (last 10 s):   {best_of(lambda: diagnose(live)) * 1000:7.1f} ms")


if __name__ == "__main__":
    main()
