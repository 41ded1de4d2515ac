"""What one refresh of 1,024 ranks' sliding figures costs, by how long since the refresh before.

The dashboard's figures thread holds itself to 5% of a core: a refresh that
costs more puts the next one off, and by then more windows have arrived.  If a
refresh's cost grew with the windows that arrived, slow refreshes would make
slower ones.  Each rank sends a window every 0.5 s; a refresh slides each rank's
20-window span (``SpanFigures``) over a live view's copy of its newest windows.

Run: .venv/bin/python benchmarks/span_refresh.py [--ranks 1024]
"""

from __future__ import annotations

import argparse
import time

from gputop.collect.live import SPAN_COPY_WINDOWS
from gputop.collect.store import Store
from gputop.model.figures import SPAN_S, summarize
from gputop.model.span import SpanFigures
from gputop.protocol import Hello, Window
from gputop.sketch import sketch_bucket

WINDOW_S = 0.5


def window(rank: int, seq: int) -> Window:
    t1 = seq * WINDOW_S + WINDOW_S
    return Window(run_id="big", rank=rank, seq=seq, t0=t1 - WINDOW_S, t1=t1, steps=5, step_total=5 * seq,
                  step_time_sum_s=0.5, step_time_p50_s=0.1, step_time_p95_s=0.12, step_time_max_s=0.13,
                  step_sketch={sketch_bucket(0.1 + 0.001 * (seq % 7)): 5}, loader_wait_s=0.02, loader_batches=5,
                  samples=160, forward_s=0.03, backward_s=0.05, comm_s=0.02, overlap_s=0.01,
                  ddp_iteration=seq * 5, cpu_pct=100.0, rss_bytes=2**30)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ranks", type=int, default=1024)
    args = parser.parse_args()
    store = Store()
    for rank in range(args.ranks):
        store.ingest(Hello(run_id="big", rank=rank, world_size=args.ranks, loader_batch_size=32, ddp=True), 0.0)
    seq = 0

    def arrive(seconds: float) -> None:
        nonlocal seq
        for _ in range(round(seconds / WINDOW_S)):
            store.ingest_many((window(rank, seq) for rank in range(args.ranks)), (seq + 1) * WINDOW_S)
            seq += 1

    spans = SpanFigures(SPAN_S)
    arrive(30.0)
    summarize(store.snapshot(seq * WINDOW_S, history=SPAN_COPY_WINDOWS), spans=spans)
    print(f"{args.ranks} ranks, a {SPAN_S:.0f}-s span, views of {SPAN_COPY_WINDOWS} windows a rank")
    for gap_s in (0.5, 1.0, 2.0, 5.0, 10.0, 15.0):
        costs = []
        for _ in range(3):
            arrive(gap_s)
            snapshot = store.snapshot(seq * WINDOW_S, history=SPAN_COPY_WINDOWS)
            started = time.thread_time()
            summarize(snapshot, spans=spans)
            costs.append(time.thread_time() - started)
        print(f"  {gap_s:4.1f} s since the last refresh: {1e3 * min(costs):6.0f} ms a refresh")


if __name__ == "__main__":
    main()
