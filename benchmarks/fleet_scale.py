"""10,000 ranks, one exporter per node, a real Prometheus with gputop's job rules: what grows with the fleet.

On a real cluster each node runs ``gputop agent --prometheus`` for its own 8
ranks.  Here ``--exporters`` agents (as many as two cores allow) each take the
ranks of many nodes, on a node-local port as a node's agent would; the ranks are
synthetic (``--drivers`` processes, asyncio, one real TCP connection per rank)
and send a hello naming their node and a window every second, the reporter's
default.  A real Prometheus scrapes every exporter at ``--scrape-s`` with
docs/prometheus/gputop-job-rules.yml loaded, and scrapes itself.

Three runs: "pretrain" (8,000 ranks; rank 4711 becomes a straggler at the plant,
the others then wait for it in the exchange), "finetune-a" (1,000 ranks, all stop
stepping at the plant while their reporters go on: a planted hang, where ranks 17,
345 and 800 never issued the all-reduce the other 997 wait in, as each rank's stack
messages number it) and "finetune-b" (1,000 ranks, healthy throughout).

Measured: Prometheus's head series, each scrape's duration and samples, the
rule group's evaluation time, the CPU and memory of the exporters (per rank),
of Prometheus and of the synthetic ranks; ``gputop fleet``'s read of the whole
fleet (latency, memory); and when the planted straggler and hang were found
(their alerts pending), from the plant and from the hang line, and when the job
rules named exactly the three ranks behind (``GputopJobRankBehind``).

Run: .venv/bin/python benchmarks/fleet_scale.py [--exporters 8] [--drivers 2] [--warm-s 60] [--scrape-s 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from gputop.diagnose.thresholds import HANG_MIN_S
from gputop.fleet.query import Prometheus, read_fleet
from gputop.protocol import GroupCalls, Hello, StackFrame, Stacks, Window, encode
from gputop.sketch import sketch_bucket

REPO = Path(__file__).resolve().parents[1]
JOB_RULES = REPO / "docs" / "prometheus" / "gputop-job-rules.yml"
RANKS_PER_NODE = 8
STRAGGLER_RUN, STRAGGLER_RANK = "pretrain", 4711  # the rank, or the run's last if it has fewer
HUNG_RUN = "finetune-a"
BEHIND = (17, 345, 800)  # the hung run's ranks that never issued the collective the others wait in
HANG_SEQ = 5000  # the all-reduce the others wait in: its number on their group
COLLECTOR_PORT = 32400  # + exporter index
METRICS_PORT = 32500  # + exporter index
PROMETHEUS_PORT = 32600
WINDOW_S = 1.0
STEP_S = 0.1


@dataclass(frozen=True)
class Rank:
    run: str
    rank: int
    world: int
    node: int
    port: int  # its node's exporter's collector
    straggler: bool = False


def layout(total: int, exporters: int) -> list[Rank]:
    """8 in 10 ranks in pretrain, a tenth in each finetune; every rank on its node (8 a node, numbered across
    runs), every node on one exporter, nodes in blocks."""
    runs = ((STRAGGLER_RUN, total - 2 * (total // 10)), (HUNG_RUN, total // 10), ("finetune-b", total // 10))
    ranks: list[Rank] = []
    for run, world in runs:
        for rank in range(world):
            ranks.append(Rank(run, rank, world, len(ranks) // RANKS_PER_NODE, 0))
    nodes = ranks[-1].node + 1
    straggler = min(STRAGGLER_RANK, runs[0][1] - 1)
    return [
        Rank(r.run, r.rank, r.world, r.node, COLLECTOR_PORT + r.node * exporters // nodes,
             straggler=r.run == STRAGGLER_RUN and r.rank == straggler)
        for r in ranks
    ]  # fmt: skip


def hello(r: Rank) -> bytes:
    local = r.rank % RANKS_PER_NODE
    return encode(
        Hello(
            run_id=r.run, rank=r.rank, world_size=r.world, local_rank=local, hostname=f"node-{r.node:04d}",
            pid=10_000 + r.rank, name="train.py", backend="nccl", device=f"cuda:{local}",
            device_uuid=f"GPU-{r.node:04x}{local:04x}-0000-0000-0000-000000000000", loader_batch_size=32,
            loader_num_workers=4, ddp=True,
        )
    )  # fmt: skip


def window(r: Rank, seq: int, step_total: int, t1: float, planted: bool) -> tuple[bytes, int]:
    """The rank's next window and its step count after it."""
    if planted and r.run == HUNG_RUN:  # stopped: the reporter goes on, the steps do not
        return encode(Window(run_id=r.run, rank=r.rank, seq=seq, t0=t1 - WINDOW_S, t1=t1, step_total=step_total,
                             cpu_pct=100.0, reporter_cpu_s=0.0004)), step_total  # fmt: skip
    step_s = STEP_S * (1 + 0.002 * (r.rank % 7))
    comm_s = 0.008  # exposed communication a step: 8%, under the line
    if planted and r.run == STRAGGLER_RUN:  # the straggler's own work grows; the others wait for it
        comm_s = 0.005 if r.straggler else 0.05
    steps = round(WINDOW_S / step_s)
    step_total += steps
    return encode(
        Window(
            run_id=r.run, rank=r.rank, seq=seq, t0=t1 - WINDOW_S, t1=t1, steps=steps, step_total=step_total,
            step_time_sum_s=steps * step_s, step_time_p50_s=step_s, step_time_p95_s=step_s * 1.1,
            step_time_max_s=step_s * 1.2, step_sketch={sketch_bucket(step_s): steps}, gpu_step_time_p50_s=step_s * 0.8,
            loader_wait_s=0.002 * steps, loader_batches=steps, samples=32 * steps, forward_s=0.03,
            backward_s=0.05, comm_s=comm_s, overlap_s=0.0, ddp_iteration=step_total, ddp_steps=steps,
            mem_allocated_bytes=20 << 30, mem_reserved_bytes=24 << 30, mem_peak_bytes=30 << 30,
            mem_total_bytes=80 << 30, alloc_retries=0, ooms=0, cpu_pct=100.0, rss_bytes=4 << 30, threads=24,
            workers=4, workers_cpu_pct=250.0, reporter_cpu_s=0.0004, hook_s=0.00001, sent_bytes=900,
        )
    ), step_total  # fmt: skip


def behind_ranks(world: int) -> tuple[int, ...]:
    """The hung run's ranks behind: 17, 345 and 800, or three spread over a smaller run."""
    return BEHIND if world > max(BEHIND) else (1, world // 2, world - 1)


def stuck_stacks(r: Rank, t: float) -> bytes:
    """A hung rank's stack message: where it is and its group's collective number, as a stuck reporter sends."""
    behind = r.rank in behind_ranks(r.world)
    group = GroupCalls("dp", HANG_SEQ - 1 if behind else HANG_SEQ, 40, 40 if behind else 39, "all_reduce", 1 << 20,
                       inside=not behind)  # fmt: skip
    now = StackFrame("outside", "train.py", 64, "wait_for_operator") if behind else StackFrame("collective", "", 0, "")
    return encode(Stacks(run_id=r.run, rank=r.rank, t=t, period_s=WINDOW_S, interval_s=0.05, samples=20, now=now,
                         groups=(group,)))  # fmt: skip


async def _report(r: Rank, spread: float, plant_t: float, stop_t: float) -> None:
    """One synthetic reporter: connect (again after a reset, as reporters do), hello, a window a second."""
    await asyncio.sleep(spread * WINDOW_S)  # the ranks' clocks are spread over the window
    seq = step_total = 0
    while time.time() < stop_t:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", r.port)
            writer.write(hello(r))
            while time.time() < stop_t:
                seq += 1
                planted = time.time() >= plant_t
                data, step_total = window(r, seq, step_total, time.time(), planted)
                writer.write(data)
                if planted and r.run == HUNG_RUN:
                    writer.write(stuck_stacks(r, time.time()))
                await writer.drain()
                await asyncio.sleep(WINDOW_S)
            writer.close()
        except OSError:
            await asyncio.sleep(0.5)


def drive(ranks: list[Rank], offset: int, total: int, plant_t: float, stop_t: float) -> None:
    async def main() -> None:
        await asyncio.gather(*(_report(r, (offset + i) / total, plant_t, stop_t) for i, r in enumerate(ranks)))

    asyncio.run(main())


def start_prometheus(folder: Path, targets: list[str], scrape_s: float) -> subprocess.Popen[bytes]:
    binary = shutil.which("prometheus")
    if binary is None:
        sys.exit("fleet_scale: needs Debian's `prometheus` (make system-deps)")
    config = folder / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {scrape_s:g}s\n  scrape_timeout: {min(scrape_s, 10):g}s\n"
        f"  evaluation_interval: {scrape_s:g}s\nrule_files:\n  - {json.dumps(str(JOB_RULES))}\n"
        f"scrape_configs:\n  - job_name: gputop\n    static_configs:\n      - targets: {json.dumps(targets)}\n"
        f"  - job_name: prometheus\n    static_configs:\n      - targets: ['127.0.0.1:{PROMETHEUS_PORT}']\n"
    )
    return subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=open(folder / "prometheus.log", "wb"),
    )  # fmt: skip


def cpu_s(procs: list[psutil.Process]) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in procs)


def one(prometheus: Prometheus, promql: str) -> float | None:
    found = prometheus.query(promql)
    return float(found[0]["value"][1]) if found else None


def alerts(prometheus: Prometheus) -> list[dict[str, str]]:
    return [a["metric"] for a in prometheus.query('ALERTS{alertname=~"Gputop.*"}')]


def fleet_read(url: str) -> tuple[float, float, int | str]:
    """`gputop fleet URL --format json` as a user runs it: seconds, its peak RSS (MiB), runs read (or its error)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gputop", "fleet", url, "--format", "json"], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    took = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    runs = len(json.loads(done.stdout)["runs"]) if done.returncode == 0 else f"failed: {done.stderr.strip()}"
    return took, max(peak, before) / 1024, runs


def watch_view(url: str, seconds: float) -> tuple[list[str], float, float] | None:
    """`gputop fleet URL` in a 160x45 tmux pane, as a user opens it: its screen after ``seconds``, its RSS (MiB)
    and its share of a core meanwhile.  None without tmux."""
    if shutil.which("tmux") is None or seconds <= 0:
        return None
    session = f"fleet-scale-{os.getpid()}"
    command = f"exec {shlex.quote(sys.executable)} -m gputop fleet {shlex.quote(url)}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "45", command], check=True)
    try:
        time.sleep(3)
        shown = subprocess.run(["tmux", "display", "-p", "-t", session, "#{pane_pid}"], capture_output=True,
                               text=True, check=True)  # fmt: skip
        view = psutil.Process(int(shown.stdout))
        cpu0, t0 = sum(view.cpu_times()[:2]), time.monotonic()
        time.sleep(seconds)
        cpu = (sum(view.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
        rss = view.memory_info().rss / 2**20
        pane = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True)
        return pane.stdout.rstrip().splitlines(), rss, cpu
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--exporters", type=int, default=8)
    parser.add_argument("--drivers", type=int, default=2)
    parser.add_argument("--warm-s", type=float, default=75.0, help="before the plant: scrapes and rules settle")
    parser.add_argument("--scrape-s", type=float, default=15.0)
    parser.add_argument("--after-s", type=float, default=90.0, help="how long to look for the planted causes")
    parser.add_argument("--view-s", type=float, default=45.0, help="how long to watch `gputop fleet` (needs tmux)")
    args = parser.parse_args()
    ranks = layout(args.ranks, args.exporters)
    (straggler,) = [r for r in ranks if r.straggler]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * len(ranks) + 1024)), hard))
    print(f"{psutil.cpu_count()} CPUs, load {psutil.getloadavg()[0]:.1f}; {len(ranks)} ranks on "
          f"{ranks[-1].node + 1} nodes, {args.exporters} exporters, {args.drivers} rank drivers")  # fmt: skip
    url = f"http://127.0.0.1:{PROMETHEUS_PORT}"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        agents = [
            subprocess.Popen(
                [sys.executable, "-m", "gputop", "agent", "--port", str(COLLECTOR_PORT + e), "--prometheus",
                 f"127.0.0.1:{METRICS_PORT + e}", "--hostname", f"exporter-{e}"],
                stdout=subprocess.DEVNULL, stderr=open(folder / f"agent-{e}.log", "wb"),  # noqa: SIM115
            )
            for e in range(args.exporters)
        ]  # fmt: skip
        prom = start_prometheus(folder, [f"127.0.0.1:{METRICS_PORT + e}" for e in range(args.exporters)],
                                args.scrape_s)  # fmt: skip
        time.sleep(3)
        start_t = time.time()
        plant_t = start_t + args.warm_s
        stop_t = plant_t + args.after_s + args.view_s + 60
        share = -(-len(ranks) // args.drivers)
        drivers = [
            multiprocessing.Process(target=drive, args=(ranks[i : i + share], i, len(ranks), plant_t, stop_t))
            for i in range(0, len(ranks), share)
        ]
        for d in drivers:
            d.start()
        prometheus = Prometheus(url)
        exporter_procs = [psutil.Process(a.pid) for a in agents]
        prom_proc = psutil.Process(prom.pid)
        driver_procs = [psutil.Process(d.pid) for d in drivers if d.pid is not None]
        try:
            # Steady state, before the plant: the last half of the warm-up, every process's CPU.
            time.sleep(args.warm_s / 2)
            c0 = (cpu_s(exporter_procs), cpu_s([prom_proc]), cpu_s(driver_procs), time.monotonic())
            time.sleep(max(plant_t - time.time() - 2, 1))
            c1 = (cpu_s(exporter_procs), cpu_s([prom_proc]), cpu_s(driver_procs), time.monotonic())
            before = alerts(prometheus)
            reporting = one(prometheus, "sum(run:gputop_ranks_reporting)")
            found_straggler = found_hang = found_behind = None
            behind = {str(rank) for rank in behind_ranks(args.ranks // 10)}
            named: set[str] = set()  # every rank GputopJobRankBehind named, right or wrong
            while time.time() < plant_t + args.after_s and None in (found_straggler, found_hang, found_behind):
                time.sleep(1)
                now_named = set()
                for a in alerts(prometheus):
                    if a["alertname"].startswith("GputopJobStraggler") and a.get("rank") == str(straggler.rank):
                        found_straggler = found_straggler or time.time() - plant_t
                    if a["alertname"] == "GputopJobHang" and a.get("run") == HUNG_RUN:
                        found_hang = found_hang or time.time() - plant_t
                    if a["alertname"] == "GputopJobRankBehind":
                        now_named.add(a.get("rank", "?") if a.get("run") == HUNG_RUN else f"{a.get('run')}:?")
                named |= now_named
                if now_named == behind:
                    found_behind = found_behind or time.time() - plant_t
            fleet = [fleet_read(url) for _ in range(3)]
            view = watch_view(url, args.view_s)
            series = one(prometheus, 'prometheus_tsdb_head_series{job="prometheus"}')
            samples = [float(s["value"][1]) for s in prometheus.query('scrape_samples_scraped{job="gputop"}')]
            scrape_took = [float(s["value"][1]) for s in prometheus.query('scrape_duration_seconds{job="gputop"}')]
            rule_s = one(prometheus, 'max(prometheus_rule_group_last_duration_seconds{rule_group=~".*gputop-job"})')
            interval_s = one(prometheus, "max(prometheus_rule_group_interval_seconds)")
            missed = one(prometheus, "sum(prometheus_rule_group_iterations_missed_total)")
            rss = {
                "exporters": sum(p.memory_info().rss for p in exporter_procs) / 2**20,
                "prometheus": prom_proc.memory_info().rss / 2**20,
            }
            summary = read_fleet(prometheus)
        finally:
            for d in drivers:
                d.terminate()
            for a in agents:
                a.terminate()
            prom.terminate()
            for p in (*agents, prom):
                p.wait(30)
    steady = c1[3] - c0[3]
    exporters_cpu, prom_cpu, drivers_cpu = ((c1[i] - c0[i]) / steady for i in range(3))
    print(f"steady state over {steady:.0f} s before the plant ({args.scrape_s:g}-s scrapes and rule evaluations):")
    print(f"  exporters: {100 * exporters_cpu:.0f}% of a core in all = {1e6 * exporters_cpu / len(ranks):.0f} "
          f"µs of CPU a second per rank ({100 * exporters_cpu / len(ranks) * RANKS_PER_NODE:.3f}% of a core for "
          f"a node of {RANKS_PER_NODE}); RSS {rss['exporters']:.0f} MiB in all = "
          f"{rss['exporters'] * 1024 / len(ranks):.0f} KiB a rank")  # fmt: skip
    print(
        f"  Prometheus: {100 * prom_cpu:.0f}% of a core, RSS {rss['prometheus']:.0f} MiB, {series:.0f} head "
        f"series; rule group {1000 * (rule_s or 0):.0f} ms every {interval_s:g} s, missed {missed:.0f}"
    )
    print(f"  synthetic ranks (not gputop): {100 * drivers_cpu:.0f}% of a core")
    print(f"  scrapes: {len(samples)} exporters, {statistics.median(samples):.0f} samples each (median), "
          f"{sum(samples):.0f} in all; duration median {1000 * statistics.median(scrape_took):.0f} ms, "
          f"max {1000 * max(scrape_took):.0f} ms")  # fmt: skip
    print(
        f"  ranks reporting by the rules: {reporting:.0f}; alerts before the plant: "
        f"{sorted({a['alertname'] for a in before}) or 'none'}"
    )
    took = sorted(f[0] for f in fleet)
    print(
        f"  gputop fleet (all runs, JSON): {1000 * took[1]:.0f} ms median of 3, peak RSS {fleet[-1][1]:.0f} MiB, "
        f"{fleet[-1][2]} runs"
    )
    say = "not found" if found_straggler is None else f"alert pending {found_straggler:.0f} s after the plant"
    print(f"planted straggler ({STRAGGLER_RUN} rank {straggler.rank}): {say}")
    hang = "not found" if found_hang is None else (
        f"alert pending {found_hang:.0f} s after the plant, {found_hang - HANG_MIN_S:.0f} s after the hang line "
        f"({HANG_MIN_S:g} s)")  # fmt: skip
    print(f"planted hang ({HUNG_RUN}): {hang}")
    wrong = sorted(named - behind, key=str)
    say = "not named" if found_behind is None else (
        f"exactly those {len(behind)} named (GputopJobRankBehind pending) {found_behind:.0f} s after the plant, "
        f"{found_behind - HANG_MIN_S:.0f} s after the hang line")  # fmt: skip
    print(f"planted ranks behind ({HUNG_RUN} ranks {', '.join(sorted(behind, key=int))}): {say}; "
          f"other ranks ever named: {', '.join(wrong) or 'none'}")  # fmt: skip
    if view is not None:
        screen, view_rss, view_cpu = view
        print(f"  gputop fleet's live view over {args.view_s:g} s: {100 * view_cpu:.1f}% of a core, RSS "
              f"{view_rss:.0f} MiB; its screen:")  # fmt: skip
        print("\n".join(f"    | {line}" for line in screen))
    for run in summary:
        worst = ", ".join(f"{s.rank}@{s.hostname} {s.score:+.0%}" for s in run.slowest)
        print(f"  fleet: {run.run} {run.ranks} ranks, slowest {worst}; alerts "
              f"{sorted({(a.name, a.state) for a in run.alerts})}")  # fmt: skip


if __name__ == "__main__":
    main()
