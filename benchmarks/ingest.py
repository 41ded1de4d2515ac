"""How many reporter messages the collector takes in per second, and its CPU per message.

N fake reporters (threads with real sockets) each send a hello and then windows
as fast as the socket takes them; we count what reached the store.  A real rank
sends 2 windows/s, so messages/s divided by 2 is how many ranks one collector
could serve at this CPU cost.

Run: .venv/bin/python benchmarks/ingest.py [--reporters 64] [--windows 2000]
"""

from __future__ import annotations

import argparse
import resource
import socket
import threading
import time

from gputop.address import Address
from gputop.collect.server import Collector
from gputop.collect.store import Store
from gputop.protocol import Hello, Window, encode, hist_bucket


def reporter(port: int, rank: int, windows: int) -> None:
    frames = [encode(Hello(run_id="bench", rank=rank, world_size=64, pid=rank))]
    for seq in range(1, windows + 1):
        frames.append(
            encode(
                Window(
                    run_id="bench",
                    rank=rank,
                    seq=seq,
                    t0=seq * 0.5,
                    t1=seq * 0.5 + 0.5,
                    steps=5,
                    step_total=5 * seq,
                    step_time_sum_s=0.5,
                    step_time_p50_s=0.1,
                    step_hist={hist_bucket(0.1): 5},
                    loader_wait_s=0.02,
                    loader_batches=5,
                    samples=160,
                    forward_s=0.03,
                    backward_s=0.05,
                    comm_s=0.02,
                    overlap_s=0.01,
                    ddp_iteration=seq,
                    cpu_pct=100.0,
                    rss_bytes=2**30,
                    threads=12,
                    workers=4,
                    workers_cpu_pct=250.0,
                )
            )
        )
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"".join(frames))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reporters", type=int, default=64)
    parser.add_argument("--windows", type=int, default=2000)
    args = parser.parse_args()
    store = Store(history_windows=None)
    collector = Collector(store, Address(port=0))
    collector.start()
    expected = args.reporters * args.windows
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    threads = [
        threading.Thread(target=reporter, args=(collector.address.port, r, args.windows)) for r in range(args.reporters)
    ]
    for t in threads:
        t.start()

    def received() -> int:
        return sum(v.windows[-1].seq for v in store.snapshot(time.time(), history=1).all_ranks() if v.windows)

    while received() < expected:
        if time.perf_counter() - t0 > 120:
            raise SystemExit(f"timed out with {received()} of {expected} windows")
        time.sleep(0.01)
    elapsed = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    collector.stop()
    cpu_s = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    rate = expected / elapsed
    print(f"{args.reporters} reporters x {args.windows} windows: {rate:,.0f} windows/s "
          f"({elapsed:.2f} s; process CPU {cpu_s / expected * 1e6:.0f} us per window, senders included)")  # fmt: skip
    print(
        f"a rank sends 2 windows/s: at 1% of one core the collector serves ~{0.01 / (cpu_s / expected) / 2:,.0f} ranks"
    )


if __name__ == "__main__":
    main()
