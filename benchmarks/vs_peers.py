"""gputop side by side with no monitor and with TraceML, on the same 2-rank gloo DDP job, in alternated rounds.

Modes, each a fresh ``torchrun`` of ``benchmarks/jobs/peer_job.py`` (a small
MLP, ~10 ms steps on 2 cores):

- ``none``: no monitor (``GPUTOP_DISABLE=1``);
- ``gputop headless``: the ranks report to a ``gputop record`` on loopback;
- ``gputop dashboard``: the ranks report to a ``gputop attach`` drawing in a
  120×40 tmux pane on the same cores;
- ``TraceML``: ``traceml run`` (its default summary mode), the job instrumented
  with ``traceml.init()`` and ``trace_step``, from a venv of its own with the
  same torch (made under ``.bench/`` on first use: torch==2.13.0 and
  traceml-ai==0.5.0; where that fails the benchmark says so and goes on
  without it);
- ``TraceML live``: the same with ``--mode=cli`` in a tmux pane.

Per round, each mode's training-loop time per step (printed by rank 0) over
the no-monitor mode's in the same round; the order rotates every round.
Printed: the median ratio and its range, the median extra wall time of the
whole command (start-up and finish included), and the monitors' own CPU
(process trees read from /proc while they run).  Beside that, gputop's own
account of what it cost (``gputop report``'s self-accounting) in the headless
mode: the figure that does not drown in the ±10% the ratios move by here.

    .venv/bin/python benchmarks/vs_peers.py [--rounds 12] [--steps 400] [--quick]

``--guard`` runs the A/B guard alone: no monitor against the headless recorder, in pairs, with a 95%
confidence interval of the median ratio (order statistics), to place gputop's cost within ±1% (issue #35).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "benchmarks" / "jobs" / "peer_job.py"
BENCH_VENV = ROOT / ".bench" / "traceml-venv"
TRACEML_SPEC = "traceml-ai==0.5.0"
TORCH_SPEC = "torch==2.13.0"
JOB_ARGS = ["--width", "384", "--batch", "128"]


@dataclass
class Run:
    """One mode in one round."""

    loop_ms_per_step: float
    wall_s: float
    monitor_cpu_s: float | None  # the monitor's own processes; None for no monitor
    report: dict[str, Any] | None = None  # gputop headless: its report, for the self-accounting


@dataclass
class Mode:
    name: str
    run: Callable[[int], Run]  # steps -> one run
    runs: list[Run] = field(default_factory=list)


# -- process trees and their CPU ----------------------------------------------------------------


class CpuMeter:
    """CPU seconds of a set of processes, polled while they live (an exited process keeps its last figure)."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}

    def poll(self, roots: list[int], *, exclude: Callable[[psutil.Process], bool] = lambda p: False) -> None:
        for root in roots:
            try:
                procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
            except psutil.Error:
                continue
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    if exclude(proc):
                        continue
                    times = proc.cpu_times()
                    self.seen[proc.pid] = times.user + times.system

    @property
    def total_s(self) -> float:
        return sum(self.seen.values())


def is_rank(proc: psutil.Process) -> bool:
    """A training rank (its CPU is the job's, not the monitor's)."""
    return any("peer_job.py" in part for part in proc.cmdline()) and "torch.distributed.run" not in " ".join(
        proc.cmdline()
    )


def run_polled(
    cmd: list[str],
    env: dict[str, str],
    meter: CpuMeter | None,
    monitor_roots: Callable[[], list[int]],
    *,
    command_tree: bool = False,
) -> tuple[str, float]:
    """Run a command to the end, polling CPU meanwhile; (its output, wall seconds).

    The meter reads ``monitor_roots()`` and, with ``command_tree``, the command's
    own process tree too (a launcher that is the monitor), ranks left out.
    """
    with tempfile.TemporaryFile("w+") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        while proc.poll() is None:
            if meter is not None:
                meter.poll([*monitor_roots(), *([proc.pid] if command_tree else [])], exclude=is_rank)
            time.sleep(0.2)
        wall = time.perf_counter() - start
        log.seek(0)
        text = log.read()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}… exited {proc.returncode}: {text[-1500:]}")
    return text, wall


def loop_ms(text: str) -> float:
    for line in text.splitlines():
        if line.startswith("loop_ms_per_step "):
            return float(line.split()[1])
    raise RuntimeError(f"the job printed no loop time: {text[-800:]}")


def torchrun(observer: str, steps: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(JOB),
            "--observer", observer, "--steps", str(steps), *JOB_ARGS]  # fmt: skip


def base_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **extra}
    env.pop("GPUTOP_SOCKET", None)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(0.2)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


# -- the modes ----------------------------------------------------------------------------------


def run_none(steps: int) -> Run:
    """No monitor; its ``monitor_cpu_s`` is torchrun's own launcher CPU, which TraceML's launcher replaces."""
    meter = CpuMeter()
    text, wall = run_polled(torchrun("none", steps), base_env(GPUTOP_DISABLE="1"), meter, list, command_tree=True)
    return Run(loop_ms(text), wall, meter.total_s)


def run_gputop_headless(steps: int) -> Run:
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="gputop-vs-peers-"))
    recording = folder / "run.jsonl"
    recorder = subprocess.Popen(
        [sys.executable, "-m", "gputop", "record", "--port", str(port), "--seconds", "600", "-o", str(recording)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port)
        meter = CpuMeter()
        meter.poll([recorder.pid])
        cpu_before = meter.total_s
        text, wall = run_polled(torchrun("gputop", steps), base_env(GPUTOP_PORT=str(port)), meter,
                                lambda: [recorder.pid])  # fmt: skip
        time.sleep(0.5)  # the ranks' last windows
        meter.poll([recorder.pid])
    finally:
        recorder.send_signal(signal.SIGTERM)  # SIGINT is ignored by a recorder started from a background shell
        recorder.wait(30)
    report = subprocess.run([sys.executable, "-m", "gputop", "report", str(recording), "--format", "json"],
                            capture_output=True, text=True, check=True)  # fmt: skip
    shutil.rmtree(folder, ignore_errors=True)
    return Run(loop_ms(text), wall, meter.total_s - cpu_before, json.loads(report.stdout))


@contextlib.contextmanager
def tmux_pane(command: str) -> Iterator[int]:
    """A detached 120x40 tmux session running ``command``; yields the pid of the process in the pane."""
    session = f"vs-peers-{os.getpid()}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "40", command], check=True)
    try:
        pid = int(subprocess.run(["tmux", "display-message", "-p", "-t", session, "#{pane_pid}"],
                                 capture_output=True, text=True, check=True).stdout.strip())  # fmt: skip
        yield pid
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def run_gputop_dashboard(steps: int, nice: str | None = None) -> Run:
    """``nice``: GPUTOP_NICE for the dashboard ("0": it does not yield the CPU, as before it did)."""
    port = free_port()
    setting = "" if nice is None else f"GPUTOP_NICE={nice} "
    with tmux_pane(f"{setting}{sys.executable} -m gputop attach --port {port}") as pane:
        wait_listening(port)
        time.sleep(1.0)  # the first frames drawn
        meter = CpuMeter()
        meter.poll([pane])
        cpu_before = meter.total_s
        text, wall = run_polled(torchrun("gputop", steps), base_env(GPUTOP_PORT=str(port)), meter, lambda: [pane])
        meter.poll([pane])
    return Run(loop_ms(text), wall, meter.total_s - cpu_before)


def traceml_command(steps: int, live: bool, logs: Path) -> list[str]:
    cmd = [str(BENCH_VENV / "bin" / "traceml"), "run", str(JOB), "--nproc-per-node=2", "--logs-dir", str(logs)]
    if live:
        cmd.append("--mode=cli")
    return [*cmd, "--args", "--observer", "traceml", "--steps", str(steps), *JOB_ARGS]


def run_traceml(steps: int, *, live: bool) -> Run:
    logs = Path(tempfile.mkdtemp(prefix="traceml-vs-peers-"))
    env = base_env(GPUTOP_DISABLE="1")
    try:
        if not live:
            meter = CpuMeter()
            _, wall = run_polled(traceml_command(steps, False, logs), env, meter, list, command_tree=True)
        else:
            done = logs / "exit_code"
            shell = " ".join(traceml_command(steps, True, logs)) + f"; echo $? > {done}"
            meter = CpuMeter()
            start = time.perf_counter()
            with tmux_pane(f"bash -c '{shell}'") as pane:
                while not done.exists():
                    meter.poll([pane], exclude=is_rank)
                    time.sleep(0.2)
            wall = time.perf_counter() - start
            if done.read_text().strip() != "0":
                raise RuntimeError(f"traceml --mode=cli exited {done.read_text().strip()}")
        stdout = next(logs.rglob("training.stdout.log")).read_text()
        return Run(loop_ms(stdout), wall, meter.total_s)
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def traceml_ready() -> str | None:
    """Make TraceML's venv if needed; None when it works, else why not (one line)."""
    traceml = BENCH_VENV / "bin" / "traceml"
    if not traceml.exists():
        try:
            subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True, capture_output=True)
            subprocess.run([str(BENCH_VENV / "bin" / "pip"), "install", "-q", TORCH_SPEC, TRACEML_SPEC],
                           check=True, capture_output=True, text=True, timeout=1200)  # fmt: skip
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            return f"TraceML could not be installed into {BENCH_VENV}: {str(detail).strip().splitlines()[-1:]}"
    return None


# -- the table ----------------------------------------------------------------------------------


def summarize(modes: list[Mode], base: Mode) -> list[str]:
    lines = ["| mode | step-time ratio (per-round range) | extra wall per run | monitor's own CPU |",
             "|---|---|---|---|"]  # fmt: skip
    launcher_s = statistics.median(b.monitor_cpu_s or 0.0 for b in base.runs)
    for mode in modes:
        if mode is base:
            ms = statistics.median(r.loop_ms_per_step for r in base.runs)
            lines.append(
                f"| {mode.name} | 1 ({ms:.2f} ms/step, median) | — | (torchrun's launcher: {launcher_s:.2f} CPU-s) |"
            )
            continue
        ratios = [r.loop_ms_per_step / b.loop_ms_per_step for r, b in zip(mode.runs, base.runs, strict=False)]
        extra = [r.wall_s - b.wall_s for r, b in zip(mode.runs, base.runs, strict=False)]
        # TraceML launches the ranks itself: its tree's CPU beyond what torchrun's launcher costs anyway.
        launcher = launcher_s if mode.name.startswith("TraceML") else 0.0
        cpu = [r.monitor_cpu_s - launcher for r in mode.runs if r.monitor_cpu_s is not None]
        wall = statistics.median(r.wall_s for r in mode.runs)
        cpu_text = (
            f"{statistics.median(cpu):.2f} CPU-s per run ({100 * statistics.median(cpu) / wall:.1f}% of a core)"
            if cpu
            else "N/A"
        )
        low, high = median_interval(ratios)
        interval = f", 95% CI of the median ×{low:.3f}-×{high:.3f}" if low is not None and high is not None else ""
        lines.append(
            f"| {mode.name} | ×{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f}{interval}) "
            f"| {statistics.median(extra):+.1f} s | {cpu_text} |"
        )
    return lines


def median_interval(values: list[float]) -> tuple[float | None, float | None]:
    """A distribution-free 95% confidence interval of the median: the order statistics the binomial(n, 1/2)
    leaves 2.5% below and above (None under 6 values, where no pair of them covers 95%)."""
    n = len(values)
    if n < 6:
        return None, None
    ordered = sorted(values)
    # The largest k with P(Binomial(n, 1/2) < k) <= 2.5%: the interval is [x_(k), x_(n+1-k)] (1-based).
    cumulative, k = 0.0, 0
    while True:
        cumulative += math.comb(n, k) / 2**n
        if cumulative > 0.025:
            break
        k += 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


def fmt(value: float | None, digits: int = 2) -> str:
    return "N/A" if value is None else f"{value:.{digits}f}"


def self_accounting(headless: Mode) -> list[str]:
    costs = [r.report["runs"][0]["gputop_cost"] for r in headless.runs if r.report and r.report["runs"]]
    if not costs:
        return []

    def med(key: str) -> float | None:
        values = [c[key] for c in costs if c.get(key) is not None]
        return statistics.median(values) if values else None

    return [
        "",
        "gputop's own account (headless mode, median over rounds, from `gputop report`):",
        f"- {fmt(med('cpu_share_pct'))}% of the ranks' CPU; reporter thread {fmt(med('reporter_cpu_pct_per_rank'))}% "
        f"of a core per rank; {fmt(med('hook_us_per_step'))} µs per step on the training thread; "
        f"{fmt(med('sent_bytes_per_s'), 0)} bytes/s sent",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 100 steps: does everything run?")
    parser.add_argument("--no-traceml", action="store_true")
    parser.add_argument("--unyielding", action="store_true", help="also the dashboard with GPUTOP_NICE=0")
    parser.add_argument(
        "--guard", action="store_true", help="the A/B guard only: no monitor against the headless recorder, paired"
    )
    args = parser.parse_args()
    rounds, steps = (2, 100) if args.quick else (args.rounds, args.steps)

    base = Mode("no monitor", run_none)
    modes = [base, Mode("gputop, headless recorder", run_gputop_headless)]
    if args.guard:
        pass
    elif shutil.which("tmux"):
        modes.append(Mode("gputop, live dashboard in tmux", run_gputop_dashboard))
        if args.unyielding:
            modes.append(Mode("gputop, live dashboard, GPUTOP_NICE=0", lambda n: run_gputop_dashboard(n, "0")))
    else:
        print("vs_peers: tmux not found: the live dashboard modes are left out", file=sys.stderr)
    why_not = "left out (--no-traceml)" if args.no_traceml or args.guard else traceml_ready()
    if why_not is None:
        modes.append(Mode("TraceML default mode", lambda n: run_traceml(n, live=False)))
        if shutil.which("tmux"):
            modes.append(Mode("TraceML live terminal view", lambda n: run_traceml(n, live=True)))
    else:
        print(f"vs_peers: TraceML {why_not}", file=sys.stderr)

    print(f"vs_peers: {rounds} rounds x {len(modes)} modes, {steps} steps each; machine: "
          f"{os.cpu_count()} CPUs, {sys.version.split()[0]}", file=sys.stderr)  # fmt: skip
    for round_no in range(rounds):
        order = modes[round_no % len(modes) :] + modes[: round_no % len(modes)]
        for mode in order:
            mode.runs.append(mode.run(steps))
        print(f"vs_peers: round {round_no + 1}/{rounds} done", file=sys.stderr, flush=True)
    print("\n".join(summarize(modes, base) + self_accounting(modes[1])))


if __name__ == "__main__":
    main()
