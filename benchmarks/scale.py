"""A 1,024-rank job on 128 hosts into one recorder with Prometheus on: what the collector costs.

Synthetic ranks (a child process, asyncio, one real TCP connection per rank)
each send a hello naming its host (node-000 … node-127, 8 ranks a host, one GPU
UUID per rank) and then a realistic window every 0.5 s, as reporters do.  A real
`gputop record --prometheus` takes them in; we read its process's CPU time and
RSS from /proc (psutil), the recording's growth, and time a few scrapes of
/metrics (size, series).  Run once plain and once compressed with windows merged.

Run: .venv/bin/python benchmarks/scale.py [--ranks 1024] [--hosts 128] [--seconds 60] [--scrape-s 15]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from gputop.protocol import Hello, Window, encode
from gputop.sketch import sketch_bucket

RECORD_PORT = 32300
METRICS_PORT = 32301
WINDOW_S = 0.5


def hello(rank: int, ranks: int, hosts: int) -> bytes:
    per_host = ranks // hosts
    return encode(
        Hello(
            run_id="scale", rank=rank, world_size=ranks, local_rank=rank % per_host,
            hostname=f"node-{rank // per_host:03d}", pid=10_000 + rank, name="train.py", backend="nccl",
            device=f"cuda:{rank % per_host}", device_uuid=f"GPU-{rank:08x}-0000-0000-0000-000000000000",
            loader_batch_size=32, loader_num_workers=4, ddp=True,
        )
    )  # fmt: skip


def window(rank: int, seq: int, t1: float) -> bytes:
    step_s = 0.1 + 0.001 * (rank % 7)
    return encode(
        Window(
            run_id="scale", rank=rank, seq=seq, t0=t1 - WINDOW_S, t1=t1, steps=5, step_total=5 * seq,
            step_time_sum_s=5 * step_s, step_time_p50_s=step_s, step_time_p95_s=step_s * 1.1,
            step_time_max_s=step_s * 1.2, step_sketch={sketch_bucket(step_s): 5}, gpu_step_time_p50_s=step_s * 0.8,
            loader_wait_s=0.02, loader_batches=5, samples=160, forward_s=0.03, backward_s=0.05, comm_s=0.02,
            overlap_s=0.01, ddp_iteration=5 * seq, ddp_steps=5, mem_allocated_bytes=20 << 30,
            mem_reserved_bytes=24 << 30, mem_peak_bytes=30 << 30, mem_total_bytes=80 << 30, alloc_retries=0,
            ooms=0, cpu_pct=100.0, rss_bytes=4 << 30, threads=24, workers=4, workers_cpu_pct=250.0,
            reporter_cpu_s=0.0004, hook_s=0.00001, sent_bytes=900,
        )
    )  # fmt: skip


async def _rank(rank: int, ranks: int, hosts: int, stop_t: float) -> None:
    """One synthetic reporter: connect (again after a reset, as reporters do), hello, a window every 0.5 s."""
    await asyncio.sleep(WINDOW_S * rank / ranks)  # spread the ranks over the window, as real clocks are
    seq = 0
    while time.time() < stop_t:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", RECORD_PORT)
            writer.write(hello(rank, ranks, hosts))
            while time.time() < stop_t:
                seq += 1
                writer.write(window(rank, seq, time.time()))
                await writer.drain()
                await asyncio.sleep(WINDOW_S)
            writer.close()
        except OSError:
            await asyncio.sleep(0.25)


def drive(ranks: int, hosts: int, seconds: float) -> None:
    async def main() -> None:
        stop_t = time.time() + seconds
        await asyncio.gather(*(_rank(r, ranks, hosts, stop_t) for r in range(ranks)))

    asyncio.run(main())


def scrape() -> tuple[float, int, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=30) as response:
        body = response.read()
    elapsed = time.perf_counter() - started
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return elapsed, len(body), series


def run(args: argparse.Namespace, output: Path, merge_after: str, *, prometheus: bool = True) -> None:
    warm_s = 10.0
    metrics = ["--prometheus", f"127.0.0.1:{METRICS_PORT}"] if prometheus else []
    recorder = subprocess.Popen(
        [sys.executable, "-m", "gputop", "record", "--port", str(RECORD_PORT), "--seconds",
         str(warm_s + args.seconds + 120), "-o", str(output), "--merge-after", merge_after, *metrics],
        stderr=open(output.with_suffix(".err"), "wb"),  # noqa: SIM115 - the child owns it
    )  # fmt: skip
    time.sleep(2)
    driver = multiprocessing.Process(target=drive, args=(args.ranks, args.hosts, warm_s + args.seconds + 5))
    driver.start()
    proc = psutil.Process(recorder.pid)
    try:
        time.sleep(warm_s)
        cpu0, size0, t0 = sum(proc.cpu_times()[:2]), output.stat().st_size, time.monotonic()
        scrapes = []
        while time.monotonic() - t0 < args.seconds:
            time.sleep(min(args.scrape_s, max(args.seconds - (time.monotonic() - t0), 0.1)))
            if prometheus:
                scrapes.append(scrape())
        cpu1, size1, t1 = sum(proc.cpu_times()[:2]), output.stat().st_size, time.monotonic()
        rss = proc.memory_info().rss
    except OSError:
        print(f"recorder said: {output.with_suffix('.err').read_text()[-2000:]}")
        raise
    finally:
        driver.join(60)
        recorder.terminate()
        recorder.wait(30)
    elapsed = t1 - t0
    write_bps = (size1 - size0) / elapsed
    times = sorted(s[0] for s in scrapes)
    merging = "every window" if merge_after == "-1" else f"merged after {merge_after} s"
    print(f"{output.name}, {merging}, Prometheus {'on' if prometheus else 'off'}: "
          f"{args.ranks} ranks on {args.hosts} hosts, {elapsed:.0f} s")  # fmt: skip
    print(f"  recorder CPU {100 * (cpu1 - cpu0) / elapsed:.0f}% of a core, RSS {rss / 2**20:.0f} MiB")
    print(f"  recording grows {write_bps / 2**10:.1f} KiB/s = {write_bps * 86400 / 2**30:.2f} GiB/day")
    if not scrapes:
        return
    print(f"  scrape: median {1000 * times[len(times) // 2]:.0f} ms (max {1000 * times[-1]:.0f} ms), "
          f"{scrapes[-1][1] / 2**20:.1f} MiB, {scrapes[-1][2]} series")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--hosts", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--scrape-s", type=float, default=15.0, help="scrape interval (Prometheus's default 15 s)")
    parser.add_argument("--runs", default="off,plain,gz,merged", help="which of off,plain,gz,merged to run")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a socket per rank on both ends
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.ranks + 256)), hard))
    print(f"{psutil.cpu_count()} CPUs, load {psutil.getloadavg()[0]:.1f} (other work on the machine counts)")
    with tempfile.TemporaryDirectory() as folder:
        runs = args.runs.split(",")
        if "off" in runs:
            run(args, Path(folder) / "off.jsonl", "-1", prometheus=False)
        if "plain" in runs:
            run(args, Path(folder) / "scale.jsonl", "-1")
        if "gz" in runs:
            run(args, Path(folder) / "scale.jsonl.gz", "-1")
        if "merged" in runs:
            run(args, Path(folder) / "merged.jsonl.gz", "0")


if __name__ == "__main__":
    main()
