"""What the dashboard costs as the ranks it shows grow: CPU, RSS and keypress latency.

N synthetic ranks (one child process, real TCP sockets, real protocol frames,
one window per rank every 0.5 s, 8 ranks per host name) report into a real
``gputop attach --port P`` running in a tmux session of the given size, as a
user would run it.  We read the dashboard's CPU and RSS from ``/proc/<pid>``
over the measuring interval, and time keypresses: ``s`` is sent with
``tmux send-keys`` and ``capture-pane`` is polled every 5 ms until the ranks
panel's title names the next sort column.  The latency includes tmux's own
redraw (a few ms), so it is an upper bound on the dashboard's.

Run: .venv/bin/python benchmarks/tui.py --ranks 2 64 1024 [--seconds 30] [--warmup 20]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import selectors
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from gputop.protocol import Hello, Window, encode
from gputop.sketch import sketch_bucket

SCRAPE_EVERY_S = 15.0  # Prometheus's default scrape interval

RANKS_PER_HOST = 8
WINDOW_S = 0.5
SORT_NAMES = ("rank", "step p50", "loader wait", "exposed comm", "samples/s", "memory", "CPU%")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def hello_of(rank: int, ranks: int) -> Hello:
    """A synthetic rank's hello: RANKS_PER_HOST ranks a host name."""
    return Hello(
        run_id="bench",
        rank=rank,
        world_size=ranks,
        pid=100000 + rank,
        hostname=f"node-{rank // RANKS_PER_HOST:03d}",
        name="bench.py",
        device="cpu",
        backend="gloo",
        ddp=True,
        loader_batch_size=32,
    )


def _window(rank: int, seq: int, now: float) -> bytes:
    slow = rank == 5  # one straggler, so the findings and the sort have something to show
    step = 0.1 * (1.0 + 0.03 * ((seq * 7 + rank * 3) % 5 - 2))
    return encode(
        Window(
            run_id="bench",
            rank=rank,
            seq=seq,
            t0=now - WINDOW_S,
            t1=now,
            steps=5,
            step_total=5 * seq,
            step_time_sum_s=5 * step,
            step_time_p50_s=step,
            step_time_p95_s=step * 1.1,
            step_time_max_s=step * 1.2,
            step_sketch={sketch_bucket(step): 5},
            loader_wait_s=(0.03 if slow else 0.002) * 5,
            loader_batches=5,
            samples=160,
            forward_s=0.03,
            backward_s=0.05,
            comm_s=0.02,
            overlap_s=0.015,
            ddp_iteration=seq,
            ddp_steps=5,
            cpu_pct=100.0,
            rss_bytes=2**30,
            threads=12,
            workers=4,
            workers_cpu_pct=250.0,
        )
    )


def run_ranks(port: int, ranks: int) -> None:
    """The child process: every rank connects, says hello, then sends a window every 0.5 s."""
    socks = []
    for rank in range(ranks):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(encode(hello_of(rank, ranks)))
        sock.setblocking(False)
        socks.append(sock)
    sel = selectors.DefaultSelector()
    seq = 0
    next_t = time.time() + WINDOW_S
    while True:
        time.sleep(max(next_t - time.time(), 0.0))
        seq += 1
        now = time.time()
        for rank, sock in enumerate(socks):
            data = _window(rank, seq, now)
            try:
                sock.send(data)  # a few hundred bytes into an empty socket buffer: sent whole
            except BlockingIOError:
                sel.register(sock, selectors.EVENT_WRITE)  # never happens unless the dashboard stalls
                sel.select(1.0)
                sel.unregister(sock)
                sock.sendall(data)
        next_t += WINDOW_S


def _proc_cpu_s(pid: int) -> float:
    return _proc_cpu_s_of(Path(f"/proc/{pid}/stat"))  # utime + stime


def _threads_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of each of the process's threads, by OS thread name (same names summed)."""
    times: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            times[name] = times.get(name, 0.0) + _proc_cpu_s_of(task / "stat")
        except OSError:
            continue  # the thread ended
    return times


def _proc_cpu_s_of(stat: Path) -> float:
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pane(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout


def _dashboard_pid(session: str) -> int:
    pane_pid = int(
        subprocess.run(["tmux", "display", "-p", "-t", session, "#{pane_pid}"], capture_output=True, text=True).stdout
    )
    return pane_pid  # the pane runs the dashboard itself (exec), not a shell


def _keypress_s(session: str, timeout_s: float = 10.0) -> float | None:
    """Press ``s`` and wait until the title names the next sort; None if it never did."""
    before = _pane(session)
    current = next((n for n in SORT_NAMES if f"sort: {n}" in before), None)
    if current is None:
        return None
    wanted = f"sort: {SORT_NAMES[(SORT_NAMES.index(current) + 1) % len(SORT_NAMES)]}"
    t0 = time.perf_counter()
    subprocess.run(["tmux", "send-keys", "-t", session, "s"])
    while time.perf_counter() - t0 < timeout_s:
        if wanted in _pane(session):
            return time.perf_counter() - t0
        time.sleep(0.005)
    return None


def _scrape_every(metrics_port: int, every_s: float, stop: threading.Event, took: list[tuple[float, int]]) -> None:
    """What a Prometheus server does: GET /metrics every ``every_s``; (seconds, series) of each scrape."""
    while not stop.wait(every_s):
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as response:
                body = response.read()
        except OSError:
            took.append((float("nan"), 0))
            continue
        series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
        took.append((time.perf_counter() - started, series))


def measure(
    ranks: int,
    port: int,
    size: str,
    warmup_s: float,
    seconds: float,
    refresh: float,
    keys: int,
    metrics_port: int | None = None,
) -> str:
    session = f"14bench{os.getpid()}"
    width, height = size.split("x")
    gputop = shutil.which("gputop") or str(Path(sys.executable).with_name("gputop"))
    cmd = f"exec {gputop} attach --port {port} --refresh {refresh}"
    if metrics_port is not None:
        cmd += f" --prometheus 127.0.0.1:{metrics_port}"
    # A tmux server already running gives the session the server's environment: pass PYTHONPATH on,
    # so a worktree's dashboard runs its own code, and unset as empty, or a server another
    # checkout started would run that checkout's code (it did: a morning's figures were a branch's).
    env = ["-e", f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}"]
    for attempt in range(5):  # a tmux server still exiting after the last session refuses new ones
        started = subprocess.run(["tmux", "new", "-d", "-s", session, *env, "-x", width, "-y", height, cmd])
        if started.returncode == 0:
            break
        time.sleep(1.0 + attempt)
    else:
        raise RuntimeError("tmux would not start a session")
    sender = None
    try:
        pid = _dashboard_pid(session)
        time.sleep(2.0)  # the dashboard binds its socket
        sender = multiprocessing.get_context("spawn").Process(target=run_ranks, args=(port, ranks), daemon=True)
        sender.start()
        time.sleep(warmup_s)
        rss0 = _rss_mib(pid)
        scrapes: list[tuple[float, int]] = []
        stop_scraping = threading.Event()
        if metrics_port is not None:
            args = (metrics_port, SCRAPE_EVERY_S, stop_scraping, scrapes)
            threading.Thread(target=_scrape_every, args=args, daemon=True).start()
        cpu0, threads0, t0 = _proc_cpu_s(pid), _threads_cpu_s(pid), time.perf_counter()
        time.sleep(seconds)
        elapsed = time.perf_counter() - t0
        cpu_pct = 100 * (_proc_cpu_s(pid) - cpu0) / elapsed
        threads1 = _threads_cpu_s(pid)
        by_thread = sorted(
            ((100 * (t - threads0.get(name, 0.0)) / elapsed, name) for name, t in threads1.items()), reverse=True
        )
        threads = ", ".join(f"{name} {pct:.1f}%" for pct, name in by_thread if pct >= 0.05)
        stop_scraping.set()
        rss1 = _rss_mib(pid)
        latencies = []
        for _ in range(keys):
            latencies.append(_keypress_s(session))
            time.sleep(0.7)
        shown = [f"{x * 1000:.0f}" if x is not None else "never" for x in latencies]
        refreshing = "refreshing" if f"ranks ({ranks})" in _pane(session) else "NOT showing every rank"
        series = max((n for _, n in scrapes), default=0)
        times = ", ".join(f"{t:.2f}" for t, _ in scrapes)
        scraped = f"  scrapes s: {times} ({series} series)" if metrics_port is not None else ""
        return (
            f"{ranks:5d} ranks  CPU {cpu_pct:5.1f}% of a core over {seconds:.0f} s (after {warmup_s:.0f} s)  "
            f"RSS {rss0:.0f} -> {rss1:.0f} MiB  keypress ms: {', '.join(shown)}  ({refreshing}){scraped}\n"
            f"       by thread: {threads}"
        )
    finally:
        if sender is not None:
            sender.kill()
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def reference_ms() -> float:
    """This machine's speed at plain Python: best of 5 of a fixed loop of formatting and dict work.

    "% of a core" is a share of this machine's core: the same dashboard measured
    2.0–2.2% at 2 ranks on one development machine and 1.3–1.4% on another ~1.7×
    faster one.  Printed beside the figures, it says which kind of core they are of.
    """
    best_s = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        cells: dict[int, str] = {}
        for i in range(200_000):
            cells[i % 512] = f"{i * 0.37:8.2f}ms".rjust(10)
        "".join(cells.values())
        best_s = min(best_s, time.perf_counter() - started)
    return best_s * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 64, 1024])
    parser.add_argument("--port", type=int, default=34100)
    parser.add_argument("--size", default="160x48", help="terminal size, COLSxROWS")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds of data before measuring")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds measured")
    parser.add_argument("--refresh", type=float, default=0.5, help="the dashboard's --refresh")
    parser.add_argument("--keys", type=int, default=5, help="keypresses timed")
    parser.add_argument(
        "--prometheus",
        type=int,
        default=None,
        metavar="PORT",
        help=f"also serve /metrics, scraped every {SCRAPE_EVERY_S:g} s",
    )
    args = parser.parse_args()
    print(
        f"gputop attach in tmux {args.size}, --refresh {args.refresh}, {os.cpu_count()} CPUs, "
        f"reference loop {reference_ms():.0f} ms",
        flush=True,
    )
    for i, ranks in enumerate(args.ranks):
        line = measure(
            ranks, args.port + i, args.size, args.warmup, args.seconds, args.refresh, args.keys, args.prometheus
        )
        print(line, flush=True)


if __name__ == "__main__":
    main()
