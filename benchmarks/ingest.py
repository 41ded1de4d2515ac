"""How many reporter messages the collector takes in per second, and its CPU per message.

N fake reporters (threads with real sockets, in a child process so their CPU
is not counted) each send a hello and then windows as fast as the socket takes
them; we count what reached the store and read the collector thread's own CPU
time.  Windows per CPU-second of that thread is the collector's capacity on
one core; a real rank sends 2 windows/s, so half of it is how many ranks one
collector core could serve.

Run: .venv/bin/python benchmarks/ingest.py [--reporters 64] [--windows 2000]
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import threading
import time

import psutil

from gputop.address import Address
from gputop.collect.server import Collector
from gputop.collect.store import Store
from gputop.protocol import Hello, Window, encode
from gputop.sketch import sketch_bucket


def frames_of(rank: int, windows: int) -> bytes:
    frames = [encode(Hello(run_id="bench", rank=rank, world_size=64, pid=rank + 1))]
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
                    step_sketch={sketch_bucket(0.1): 5},
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
    return b"".join(frames)


def send_all(port: int, streams: list[bytes]) -> None:
    """The child process: one connection per reporter, all sending at once."""

    def send(data: bytes) -> None:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(data)
            # The collector greets every TCP connection: closing with its greeting unread would reset
            # the connection, and the kernel would drop whatever the collector had not read yet.
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(4096):
                pass

    threads = [threading.Thread(target=send, args=(data,)) for data in streams]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def thread_cpu_s(native_id: int) -> float:
    for thread in psutil.Process().threads():
        if thread.id == native_id:
            return thread.user_time + thread.system_time
    raise RuntimeError("the collector thread is gone")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reporters", type=int, default=64)
    parser.add_argument("--windows", type=int, default=2000)
    args = parser.parse_args()
    store = Store(history_windows=None)
    collector = Collector(store, Address(port=0))
    collector.start()
    collector_thread = next(t for t in threading.enumerate() if t.name == "gputop-collector")
    assert collector_thread.native_id is not None
    streams = [frames_of(r, args.windows) for r in range(args.reporters)]
    expected = args.reporters * args.windows
    cpu0 = thread_cpu_s(collector_thread.native_id)
    t0 = time.perf_counter()
    sender = multiprocessing.get_context("fork").Process(target=send_all, args=(collector.address.port, streams))
    sender.start()

    def received() -> int:
        return sum(v.windows[-1].seq for v in store.snapshot(time.time(), history=1).all_ranks() if v.windows)

    while received() < expected:
        if time.perf_counter() - t0 > 120:
            raise SystemExit(f"timed out with {received()} of {expected} windows")
        time.sleep(0.01)
    elapsed = time.perf_counter() - t0
    cpu_s = thread_cpu_s(collector_thread.native_id) - cpu0
    sender.join()
    collector.stop()
    frame_bytes = sum(len(s) for s in streams) / (expected + args.reporters)
    print(f"{args.reporters} reporters x {args.windows} windows ({frame_bytes:.0f} bytes a frame): "
          f"{expected / elapsed:,.0f} windows/s wall ({elapsed:.2f} s, senders on the other core)")  # fmt: skip
    print(f"collector thread: {cpu_s / expected * 1e6:.2f} us of CPU per window = "
          f"{expected / cpu_s:,.0f} windows per CPU-second")  # fmt: skip
    print(f"a rank sends 2 windows/s: at 1% of one core the collector serves ~{0.01 * expected / cpu_s / 2:,.0f} ranks")


if __name__ == "__main__":
    main()
