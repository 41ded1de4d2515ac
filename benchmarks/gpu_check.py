"""`make gpu-check`: every GPU-side claim gputop makes, checked on a real GPU against something independent.

On a machine with an NVIDIA GPU, the driver's ``nvidia-smi`` and torch with
CUDA, it runs each check, prints a table (check, expected, measured, result)
and writes it as markdown.  On a machine without one it says why in one line
and exits 2.  It installs nothing: it uses the torch and gputop that are there.

    .venv/bin/python benchmarks/gpu_check.py [--only NAME ...] [--list] [--output gpu-check.md]
        [--json FILE] [--job-log FILE] [--budget-s SECONDS]

On a lent GPU machine ``scripts/gpu-device`` runs it with a budget (docs/gpu.md).

Exit status: 0 when every check passed, 1 when one failed or broke, 2 when
there is no GPU to check on.  Each check is independent: one that breaks
records why and the others still run.

A check is a function returning ``Row``s, registered in ``CHECKS``.  What
they stand on: ``read_smi()`` (per GPU) and ``read_compute_apps()`` (per
process and GPU) from nvidia-smi; ``run_job()``/``recorded_job()`` for a
1-rank NCCL job of ``gpu_jobs/gpu_job.py`` with or without a recorder;
``job_contexts()`` for which of a running job's processes hold a CUDA
context on which GPU, with how much memory.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import io
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "benchmarks" / "gpu_jobs" / "gpu_job.py"
EXIT_NO_GPU = 2
SMI_FIELDS = ("uuid", "index", "utilization.gpu", "memory.used", "power.draw", "temperature.gpu")
MIB = 1 << 20
JOB_TIMEOUT_S = 600.0  # one job's limit when no budget is set


# -- the time budget and the job log ------------------------------------------------------------
#
# On a lent GPU the whole call has minutes: ``--budget-s`` sets a deadline that every job's timeout
# is cut to, and a check whose estimate no longer fits is skipped with a row saying so.
# ``--job-log`` appends every job's output, so a failing row can be read back without a rerun.

_deadline: float | None = None
_job_log: Path | None = None


def job_timeout_s() -> float:
    """A job's timeout: what is left of the budget (at least 10 s), or JOB_TIMEOUT_S without one."""
    if _deadline is None:
        return JOB_TIMEOUT_S
    return max(10.0, min(JOB_TIMEOUT_S, _deadline - time.monotonic()))


def log_job(title: str, output: str) -> None:
    """One job's output in the job log, under a header naming it."""
    if _job_log is None:
        return
    with _job_log.open("a", encoding="utf-8") as log:
        log.write(f"\n===== {time.strftime('%H:%M:%S')} {title}\n{output.rstrip()}\n")


# -- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One check's line in the table."""

    check: str
    expected: str
    measured: str
    result: str  # "pass", "fail", or "error: <why>"

    @property
    def passed(self) -> bool:
        return self.result == "pass"


def markdown_table(rows: Sequence[Row]) -> str:
    """The table as markdown; pipes in cells are escaped so a message cannot break a row."""
    lines = ["| check | expected | measured | result |", "|---|---|---|---|"]
    for row in rows:
        cells = [c.replace("|", "\\|").replace("\n", " ") for c in (row.check, row.expected, row.measured, row.result)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# -- the independent reference: nvidia-smi ------------------------------------------------------


@dataclass(frozen=True)
class SmiReading:
    """One GPU as ``nvidia-smi --query-gpu`` prints it (None where it printed N/A)."""

    uuid: str
    index: int
    util_pct: float | None
    mem_used_bytes: int | None
    power_w: float | None
    temp_c: float | None


def _number(cell: str) -> float | None:
    cell = cell.strip()
    try:
        return float(cell)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def parse_smi_csv(text: str) -> list[SmiReading]:
    """Rows of ``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits``."""
    readings = []
    for cells in csv.reader(io.StringIO(text)):
        if len(cells) < len(SMI_FIELDS):
            continue
        mem_mib = _number(cells[3])
        readings.append(
            SmiReading(
                uuid=cells[0].strip(),
                index=int(cells[1]),
                util_pct=_number(cells[2]),
                mem_used_bytes=None if mem_mib is None else int(mem_mib * MIB),
                power_w=_number(cells[4]),
                temp_c=_number(cells[5]),
            )
        )
    return readings


def read_smi() -> list[SmiReading]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return parse_smi_csv(out.stdout)


@dataclass(frozen=True)
class ComputeApp:
    """One row of ``nvidia-smi --query-compute-apps``: a process holding a CUDA context on a GPU."""

    pid: int
    gpu_uuid: str
    used_bytes: int | None


def parse_compute_apps(text: str) -> list[ComputeApp]:
    """Rows of ``nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits``."""
    apps = []
    for cells in csv.reader(io.StringIO(text)):
        if len(cells) < 3 or not cells[0].strip().isdigit():  # "No running processes found" is no row
            continue
        mib = _number(cells[2])
        apps.append(ComputeApp(int(cells[0]), cells[1].strip(), None if mib is None else int(mib * MIB)))
    return apps


def read_compute_apps() -> list[ComputeApp]:
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return parse_compute_apps(out.stdout)


def within(measured: float | None, reference: float | None, *, rel: float = 0.0, abs_: float = 0.0) -> bool:
    """Whether two readings agree within ``abs_ + rel × |reference|``; a missing one never agrees."""
    if measured is None or reference is None:
        return False
    return abs(measured - reference) <= abs_ + rel * abs(reference)


# -- preflight ----------------------------------------------------------------------------------


def why_no_gpu() -> str | None:
    """Why this machine cannot run the checks, in one line; None when it can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed here (make gpu-check uses the torch that is there, it installs none)"
    if not torch.cuda.is_available():
        return f"no CUDA GPU visible to torch {torch.__version__} (a CPU build, no driver, or no device)"
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi is not on PATH: it is the independent reference the checks compare with"
    from gputop.collect.gpu.nvml import Nvml

    problem = Nvml().start()
    if problem is not None:
        return f"gputop cannot read NVML: {problem}"
    return None


# -- running jobs under a recorder --------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gputop_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gputop", *args]


@contextlib.contextmanager
def recording(seconds: float = 600.0) -> Iterator[tuple[int, Path]]:
    """A ``gputop record`` on a free port for the duration of the block; yields (port, file)."""
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="gputop-gpu-check-"))
    path = folder / "run.jsonl"
    recorder = subprocess.Popen(
        gputop_cli("record", "--port", str(port), "--seconds", str(seconds), "-o", str(path)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not _listening(port) and time.monotonic() < deadline:
            if recorder.poll() is not None:
                raise RuntimeError(f"gputop record exited: {recorder.stderr.read() if recorder.stderr else ''}")
            time.sleep(0.1)
        yield port, path
    finally:
        if recorder.poll() is None:
            time.sleep(1.0)  # the ranks' last windows and byes
            recorder.send_signal(signal.SIGTERM)  # as kill and Slurm do; SIGINT may be ignored in the background
        try:
            recorder.wait(30)
        except subprocess.TimeoutExpired:
            recorder.kill()


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def job_command(mode: str, steps: int, job_args: Sequence[str] = ()) -> list[str]:
    """A 1-rank torchrun of gpu_job.py."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(JOB),
            "--mode", mode, "--steps", str(steps), *job_args]  # fmt: skip


def job_env(port: int | None, env: dict[str, str] | None = None, unset: Sequence[str] = ()) -> dict[str, str]:
    """The job's environment: reporting to ``port`` (None: nowhere in particular), ``env`` added, ``unset`` removed."""
    # CUDA numbers devices fastest-first by default, nvidia-smi by PCI bus: make them the same.
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID", **(env or {})}
    for name in ("GPUTOP_SOCKET", *unset):
        full_env.pop(name, None)
    if port is not None:
        full_env["GPUTOP_PORT"] = str(port)
    return full_env


def kill_tree(job: subprocess.Popen[str]) -> None:
    """End a job started in a session of its own and everything it started (torchrun's workers), if still there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(job.pid, signal.SIGKILL)


def run_tree(
    cmd: Sequence[str], *, env: dict[str, str] | None = None, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` for a job that starts others: in a session of its own, whose every process is killed at
    the timeout (a timed-out torchrun's worker would go on training into the next check's measurements)."""
    job = subprocess.Popen(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)  # fmt: skip
    try:
        out, err = job.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_tree(job)
        out, err = job.communicate()
        raise subprocess.TimeoutExpired(list(cmd), timeout_s, out, err) from None
    finally:
        kill_tree(job)  # anything the job left behind when it exited
    return subprocess.CompletedProcess(list(cmd), job.returncode, out, err)


def run_job(
    mode: str,
    *,
    steps: int,
    port: int | None,
    env: dict[str, str] | None = None,
    unset: Sequence[str] = (),
    job_args: Sequence[str] = (),
) -> float:
    """A 1-rank torchrun of gpu_job.py; returns its steps/s.  Raises with the job's output if it fails."""
    printed = job_output(mode, steps=steps, port=port, env=env, unset=unset, job_args=job_args)
    rate = printed_number(printed, "steps")
    if rate is None:
        raise RuntimeError(f"{mode} job printed no steps/s: {printed[-400:]}")
    return rate


def job_output(
    mode: str,
    *,
    steps: int,
    port: int | None,
    env: dict[str, str] | None = None,
    unset: Sequence[str] = (),
    job_args: Sequence[str] = (),
) -> str:
    """A 1-rank torchrun of gpu_job.py; returns what it printed.  Raises with the job's output if it fails."""
    cmd = job_command(mode, steps, job_args)
    out = run_tree(cmd, env=job_env(port, env, unset), timeout_s=job_timeout_s())
    log_job(f"{mode} job, {steps} steps, env {env or {}}, args {list(job_args)}: exit {out.returncode}",
            out.stdout + out.stderr)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"{mode} job exited {out.returncode}: {(out.stdout + out.stderr)[-800:]}")
    return out.stdout


def printed_number(printed: str, prefix: str, field: int = -1) -> float | None:
    """The number a job printed on its line starting with ``prefix`` (the line's last word by default)."""
    for line in printed.splitlines():
        if line.startswith(prefix + " "):
            return float(line.split()[field])
    return None


POLL_S = 0.5  # how often job_contexts asks nvidia-smi while the job runs


def job_contexts(
    mode: str,
    *,
    steps: int,
    port: int | None,
    env: dict[str, str] | None = None,
    unset: Sequence[str] = (),
    job_args: Sequence[str] = (),
) -> dict[int, dict[str, int | None]]:
    """Run a 1-rank job and watch nvidia-smi's process list until it exits.

    Returns, for each of the job's processes (torchrun and its descendants)
    that nvidia-smi listed, the UUIDs of the GPUs it held a CUDA context on
    and the most memory seen there.  Raises with the job's output if it fails.
    """
    import psutil

    seen: dict[int, dict[str, int | None]] = {}
    with tempfile.TemporaryFile("w+") as output:
        job = subprocess.Popen(job_command(mode, steps, job_args), env=job_env(port, env, unset), stdout=output,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
        pids = {job.pid}
        deadline = time.monotonic() + job_timeout_s()
        try:
            while job.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(psutil.Error):
                    pids |= {child.pid for child in psutil.Process(job.pid).children(recursive=True)}
                for app in read_compute_apps():
                    if app.pid in pids:
                        held = seen.setdefault(app.pid, {})
                        known = [u for u in (held.get(app.gpu_uuid), app.used_bytes) if u is not None]
                        held[app.gpu_uuid] = max(known) if known else None
                time.sleep(POLL_S)
        finally:
            kill_tree(job)
            job.wait()
        output.seek(0)
        text = output.read()
        log_job(f"{mode} job watched by nvidia-smi, {steps} steps, args {list(job_args)}: exit {job.returncode}", text)
        if job.returncode != 0:
            raise RuntimeError(f"{mode} job exited {job.returncode}: {text[-800:]}")
    return seen


def report_of(path: Path) -> dict[str, Any]:
    out = subprocess.run(gputop_cli("report", str(path), "--format", "json"), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"gputop report failed: {out.stderr.strip()}")
    return dict(json.loads(out.stdout))


def recorded_job(
    mode: str, *, steps: int, env: dict[str, str] | None = None, unset: Sequence[str] = ()
) -> dict[str, Any]:
    """The report of one job run under a recorder."""
    with recording() as (port, path):
        run_job(mode, steps=steps, port=port, env=env, unset=unset)
    return report_of(path)


def only_rank(report: dict[str, Any]) -> dict[str, Any]:
    (run,) = report["runs"]
    (rank,) = run["ranks"]
    return dict(rank)


def causes(report: dict[str, Any], *, at_least: str = "warn") -> set[str]:
    levels = ["info", "warn", "critical"]
    return {f["cause"] for f in report["findings"] if levels.index(f["severity"]) >= levels.index(at_least)}


# -- the checks ---------------------------------------------------------------------------------


@contextlib.contextmanager
def child_load(code: str) -> Iterator[int]:
    """``code`` in a child Python process, given 5 s to start (CUDA context, allocation, clocks up); its pid."""
    load = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(5.0)
        yield load.pid
    finally:
        load.kill()
        load.wait()


def gpu_load(seconds: float) -> contextlib.AbstractContextManager[int]:
    """Matmuls on GPU 0 in a child process, so utilization, memory and power have something to show."""
    return child_load(
        f"import time, torch; a = torch.randn(8192, 8192, device='cuda'); end = time.time() + {seconds}\n"
        "while time.time() < end: a = (a @ a).clamp_(-1, 1)\n"
    )


# gputop's NVML reading against nvidia-smi's, field by field: (name, the tolerance, whether a pair agrees, the pair
# as shown).
NVML_TOLERANCES: list[tuple[str, str, Callable[[Any, SmiReading], bool], Callable[[Any, SmiReading], str]]] = [
    ("memory used", "within 2% + 64 MiB",
     lambda g, s: within(g.mem_used_bytes, s.mem_used_bytes, rel=0.02, abs_=64 * MIB),
     lambda g, s: f"{(g.mem_used_bytes or 0) / MIB:.0f} vs {(s.mem_used_bytes or 0) / MIB:.0f} MiB"),
    ("utilization", "within 20 points (NVML averages over its own window)",
     lambda g, s: within(g.util_pct, s.util_pct, abs_=20.0),
     lambda g, s: f"{g.util_pct} vs {s.util_pct} %"),
    ("power", "within 15% + 10 W",
     lambda g, s: within(g.power_w, s.power_w, rel=0.15, abs_=10.0),
     lambda g, s: f"{g.power_w} vs {s.power_w} W"),
    ("temperature", "within 3 °C",
     lambda g, s: within(g.temp_c, s.temp_c, abs_=3.0),
     lambda g, s: f"{g.temp_c} vs {s.temp_c} °C"),
]  # fmt: skip


def mostly_agree(agreeing: int, pairs: int) -> bool:
    """A field of the sampler agrees with nvidia-smi: in at least 80% of the paired readings (each reads its own
    moment), and there were readings to pair."""
    return pairs > 0 and agreeing >= 0.8 * pairs


def check_nvml_vs_smi() -> list[Row]:
    """gputop's NVML sampler against nvidia-smi, read back to back, under a matmul load."""
    from gputop.collect.gpu.sampler import GpuSampler

    sampler = GpuSampler()
    pairs = []
    with gpu_load(30.0):
        for _ in range(10):
            mine = {g.uuid: g for g in sampler.sample().gpus}
            for smi in read_smi():
                if smi.uuid in mine:
                    pairs.append((mine[smi.uuid], smi))
            time.sleep(1.0)
    sampler.close()
    if not pairs:
        return [Row("NVML sampler vs nvidia-smi", "same GPUs by UUID", "no UUID in common", "fail")]
    rows = []
    for name, expected, agrees, show in NVML_TOLERANCES:
        agreeing = sum(agrees(g, s) for g, s in pairs)
        worst = next(((g, s) for g, s in pairs if not agrees(g, s)), pairs[-1])
        rows.append(
            Row(
                f"NVML sampler vs nvidia-smi: {name}",
                f"{expected}, in ≥ 80% of {len(pairs)} paired readings",
                f"{agreeing}/{len(pairs)} agree; e.g. {show(*worst)}",
                "pass" if mostly_agree(agreeing, len(pairs)) else "fail",
            )
        )
    return rows


def copy_load(seconds: float) -> contextlib.AbstractContextManager[int]:
    """Host-to-device copies of a pinned 256 MiB buffer in a child process: PCIe traffic for the counters."""
    return child_load(
        "import time, torch; h = torch.empty(64 << 20, pin_memory=True); d = torch.empty(64 << 20, device='cuda')\n"
        f"end = time.time() + {seconds}\n"
        "while time.time() < end: d.copy_(h, non_blocking=True); torch.cuda.synchronize()\n"
    )


def check_nvml_processes_and_links() -> list[Row]:
    """The process list, the PCIe/NVLink counters and the sample's own cost, through the real driver."""
    from gputop.collect.gpu.sampler import GpuSampler

    sampler = GpuSampler()
    rows = []
    with copy_load(20.0) as pid:
        sampler.sample()  # counters need two samples
        time.sleep(1.0)
        start = time.perf_counter()
        sample = sampler.sample()
        took_s = time.perf_counter() - start
        apps = {(a.pid, a.gpu_uuid): a for a in read_compute_apps()}
    sampler.close()
    listed = [(g, p) for g in sample.gpus for p in g.processes if p.pid == pid]
    smi = [a for (app_pid, _), a in apps.items() if app_pid == pid]
    rows.append(
        Row(
            "NVML process list (versioned call) vs nvidia-smi",
            "the copying process listed with nvidia-smi's memory (±64 MiB)",
            f"gputop: {[(g.index, (p.used_bytes or 0) // MIB) for g, p in listed]} MiB; "
            f"nvidia-smi: {[(a.gpu_uuid[:12], (a.used_bytes or 0) // MIB) for a in smi]} MiB",
            "pass" if process_agrees([p.used_bytes for _, p in listed], [a.used_bytes for a in smi]) else "fail",
        )
    )
    gpu = listed[0][0] if listed else (sample.gpus[0] if sample.gpus else None)
    rx = None if gpu is None else gpu.pcie_rx_bytes_s
    rows.append(
        Row(
            "PCIe counters under host-to-device copies",
            "rx between 1 and 128 GB/s (field 198, differenced)",
            f"rx {'N/A' if rx is None else f'{rx / 1e9:.1f}'} GB/s"
            + ("" if gpu is None or rx is not None else f" ({gpu.na.get('pcie_rx_bytes_s')})"),
            "pass" if pcie_plausible(rx) else "fail",
        )
    )
    nvlink = [(g.index, g.nvlink_rx_bytes_s, g.nvlink_tx_bytes_s, g.na.get("nvlink_rx_bytes_s")) for g in sample.gpus]
    plausible = all(nvlink_plausible(rx_, tx_, why) for _, rx_, tx_, why in nvlink)
    rows.append(
        Row(
            "NVLink counters (all links, scope UINT_MAX)",
            "a rate between 0 and 1 TB/s each way, or N/A with a reason (no NVLink)",
            "; ".join(f"GPU {i}: {rx_} / {tx_} B/s {why or ''}" for i, rx_, tx_, why in nvlink),
            "pass" if plausible else "fail",
        )
    )
    rows.append(
        Row(
            "one GPU sample's wall time",
            "≤ 50 ms (no blocking PCIe call)",
            f"{took_s * 1e3:.1f} ms for {len(sample.gpus)} GPU rows",
            "pass" if sample_fast(took_s) else "fail",
        )
    )
    return rows


def process_agrees(gputop_bytes: Sequence[int | None], smi_bytes: Sequence[int | None]) -> bool:
    """The copying process is in gputop's list and nvidia-smi's, once each, with the same memory (±64 MiB)."""
    return len(gputop_bytes) == len(smi_bytes) == 1 and within(gputop_bytes[0], smi_bytes[0], abs_=64 * MIB)


def pcie_plausible(rx_bytes_s: float | None) -> bool:
    """Host-to-device copies read as 1 to 128 GB/s received (PCIe 3 x16 to 6 x16)."""
    return rx_bytes_s is not None and 1e9 <= rx_bytes_s <= 128e9


def nvlink_plausible(rx: float | None, tx: float | None, why: str | None) -> bool:
    """An NVLink rate each way between 0 and 1 TB/s, or N/A with its reason (no NVLink): never a bare N/A."""
    if rx is None or tx is None:
        return rx is None and tx is None and bool(why)
    return 0 <= rx <= 1e12 and 0 <= tx <= 1e12


def sample_fast(took_s: float) -> bool:
    """One NVML sample of every GPU within 50 ms: no call that blocks on the bus."""
    return took_s <= 0.05


def check_join() -> list[Row]:
    """The rank lands on the GPU nvidia-smi gives that device's UUID, with CUDA_VISIBLE_DEVICES unset and set."""
    smi = read_smi()
    last = max(smi, key=lambda r: r.index)
    rows = []
    for label, env, expected_uuid in (
        ("CUDA_VISIBLE_DEVICES unset", {}, min(smi, key=lambda r: r.index).uuid),
        (f"CUDA_VISIBLE_DEVICES={last.index}", {"CUDA_VISIBLE_DEVICES": str(last.index)}, last.uuid),
    ):
        report = recorded_job("bf16", steps=100, env=env, unset=() if env else ("CUDA_VISIBLE_DEVICES",))
        on = [g["uuid"] for g in report["gpus"].get("gpus", []) if g["ranks"]]
        rank_uuid = only_rank(report)["device_uuid"]
        ok = join_agrees(on, rank_uuid, expected_uuid)
        rows.append(
            Row(f"rank-GPU join by UUID ({label})", f"rank 0 on {expected_uuid}",
                f"rank reports {rank_uuid}; report puts it on {on or 'no GPU'}", "pass" if ok else "fail")
        )  # fmt: skip
    return rows


def join_agrees(gpus_with_ranks: Sequence[str], rank_uuid: str | None, expected_uuid: str) -> bool:
    """The rank says it is on the expected GPU, and the report joins it to that GPU and no other."""
    return list(gpus_with_ranks) == [expected_uuid] and _same_uuid(rank_uuid, expected_uuid)


def _same_uuid(a: str | None, b: str) -> bool:
    from gputop.model.join import normalize_uuid

    return normalize_uuid(a) == normalize_uuid(b)


def check_gpu_step_time() -> list[Row]:
    """CUDA-event GPU step time against wall step time, and the parallelism rule on both kinds of job."""
    rows = []
    for mode, low, high, wants_parallelism in (("gpu_bound", 0.8, 1.2, False), ("launch_bound", 0.0, 0.5, True)):
        report = recorded_job(mode, steps=300 if mode == "gpu_bound" else 3000)
        rank = only_rank(report)
        gpu, wall = rank["gpu_step_time_p50_ms"], rank["step_time_p50_ms"]
        ratio = gpu / wall if gpu is not None and wall else None
        fired = "parallelism" in causes(report)
        ok = step_time_agrees(ratio, (low, high), fired, wants_parallelism)
        rows.append(
            Row(f"GPU step / wall step ({mode})",
                f"ratio in [{low}, {high}]; parallelism finding {'fires' if wants_parallelism else 'silent'}",
                f"{gpu} / {wall} ms = {'N/A' if ratio is None else f'{ratio:.2f}'}; parallelism "
                f"{'fired' if fired else 'silent'}", "pass" if ok else "fail")
        )  # fmt: skip
    return rows


def step_time_agrees(ratio: float | None, band: tuple[float, float], fired: bool, wants_parallelism: bool) -> bool:
    """The GPU's step over the wall's in the job's band (a GPU-bound job ~1, a launch-bound one far under), and
    the parallelism finding there exactly where the job was made to trip it."""
    return ratio is not None and band[0] <= ratio <= band[1] and fired == wants_parallelism


def check_rules() -> list[Row]:
    """The GPU-only rules on jobs made to trip them, and silent on the job made not to."""
    rows = []
    demo = run_tree(
        gputop_cli("demo", "--scenario", "memory_pressure", "--nproc", "1", "--headless", "--seconds", "20",
                   "--format", "json"),
        timeout_s=job_timeout_s(),
    )  # fmt: skip
    log_job(f"memory_pressure demo: exit {demo.returncode}", demo.stderr)
    if demo.returncode != 0:
        rows.append(Row("memory_pressure demo → memory", "a memory finding", demo.stderr.strip()[-300:], "fail"))
    else:
        found = causes(json.loads(demo.stdout))  # warn or critical: "the batch could grow" (info) is no pass
        rows.append(Row("memory_pressure demo → memory", "a memory warning", ", ".join(sorted(found)) or "none",
                        "pass" if "memory" in found else "fail"))  # fmt: skip
    fp32 = causes(recorded_job("fp32", steps=200))
    rows.append(Row("fp32 without autocast → model_config", "a model_config warning on a tensor-core GPU",
                    ", ".join(sorted(fp32)) or "none", "pass" if "model_config" in fp32 else "fail"))  # fmt: skip
    bf16 = causes(recorded_job("bf16", steps=200))
    rows.append(Row("bf16 autocast → no model_config", "no model_config warning", ", ".join(sorted(bf16)) or "none",
                    "pass" if "model_config" not in bf16 else "fail"))  # fmt: skip
    report = recorded_job("slow_loader", steps=100)
    util = [g["util_mean_pct"] for g in report["gpus"].get("gpus", []) if g["ranks"]]
    slow = causes(report)
    ok = loader_row_agrees(slow, util)
    measured = f"{', '.join(sorted(slow)) or 'none'}; GPU util mean {util}"
    rows.append(Row("slow loader → data_loading, GPU idle", "data_loading warning; the rank's GPU under 50% busy",
                    measured, "pass" if ok else "fail"))  # fmt: skip
    return rows


def loader_row_agrees(found: set[str], util_mean_pct: Sequence[float | None]) -> bool:
    """A slow loader reads data_loading, and the rank's GPU (the only one with a rank) idles most of the time."""
    return (
        "data_loading" in found and len(util_mean_pct) == 1 and util_mean_pct[0] is not None and util_mean_pct[0] < 50
    )


def one_context_on(
    seen: dict[int, dict[str, int | None]], gpu: SmiReading, smi: Sequence[SmiReading]
) -> tuple[str, str]:
    """(result, what was seen) for a 1-rank job: one process with one CUDA context, on ``gpu``, none anywhere else."""
    index_of = {r.uuid: r.index for r in smi}
    held = sorted((pid, uuid, used) for pid, gpus in seen.items() for uuid, used in gpus.items())
    shown = "; ".join(
        f"pid {pid} on GPU {index_of.get(uuid, '?')} ({uuid}, {(used or 0) / MIB:.0f} MiB)" for pid, uuid, used in held
    )
    if not held:
        return "error: nvidia-smi listed no process of the job (a PID namespace of its own?)", "none listed"
    ok = len(held) == 1 and _same_uuid(held[0][1], gpu.uuid)
    return ("pass" if ok else "fail"), shown


def check_cuda_contexts() -> list[Row]:
    """One CUDA context per rank, on its GPU, and none on another GPU: nvidia-smi's process list during the job."""
    smi = read_smi()
    first, last = min(smi, key=lambda r: r.index), max(smi, key=lambda r: r.index)
    rows = []
    for placement, gpu, label in (
        ("set_device", first, f"torch.cuda.set_device({first.index})"),
        ("last_gpu", last, f"model.to({last.index}) without set_device"),
    ):
        job: dict[str, Any] = {"steps": 300, "unset": ("CUDA_VISIBLE_DEVICES",),
                               "job_args": ("--placement", placement, "--hold-s", "3")}  # fmt: skip
        with recording() as (port, _):
            result, on = one_context_on(job_contexts("bf16", port=port, **job), gpu, smi)
        _, off = one_context_on(job_contexts("bf16", port=None, env={"GPUTOP_DISABLE": "1"}, **job), gpu, smi)
        rows.append(Row(f"CUDA contexts, one per rank ({label})",
                        f"the rank's process on GPU {gpu.index} only; gputop adds no context",
                        f"gputop on: {on} | gputop off: {off}", result))  # fmt: skip
    return rows


def check_ddp_timings() -> list[Row]:
    """DDP's forward, backward and exchange times on NCCL are measurements: non-zero wherever a window has them."""
    from gputop.collect.recording import read
    from gputop.protocol import Event, Window

    with recording() as (port, path):
        run_job("bf16", steps=2000, port=port)
    windows: list[Window] = []
    reasons: list[str] = []
    for entry in read(path):
        message = entry.value
        if isinstance(message, Window) and message.comm_s is not None:
            windows.append(message)
        elif isinstance(message, Event) and message.kind == "not_measured" and message.message.startswith("ddp_"):
            reasons.append(message.message)
    zero = [w for w in windows if not ddp_window_measured(w.forward_s, w.backward_s, w.comm_s)]
    last = windows[-1] if windows else None
    example = (
        "none"
        if last is None
        else f"forward {(last.forward_s or 0) * 1e3:.2f}, backward {(last.backward_s or 0) * 1e3:.2f}, "
        f"comm {(last.comm_s or 0) * 1e3:.2f} ms"
    )
    ok = ddp_timings_agree(len(windows), len(zero), reasons)
    return [Row("DDP timings on NCCL are measured", "≥ 2 windows with DDP figures, forward/backward/comm > 0 in each; "
                "no not_measured reason", f"{len(windows)} windows, {len(zero)} with a zero; last: {example}; "
                f"reasons: {'; '.join(reasons) or 'none'}", "pass" if ok else "fail")]  # fmt: skip


def ddp_window_measured(forward_s: float | None, backward_s: float | None, comm_s: float | None) -> bool:
    """DDP's own timers measured this window: forward, backward and the exchange each more than 0."""
    return bool(forward_s and backward_s and comm_s)


def ddp_timings_agree(windows: int, zero: int, reasons: Sequence[str]) -> bool:
    """At least two windows with DDP's figures, none with a zero, and no reason given for one not measured."""
    return windows >= 2 and zero == 0 and not reasons


def overhead_agrees(on_rates: Sequence[float], off_rates: Sequence[float]) -> bool:
    """gputop on keeps at least 97% of the steps/s with it off, median against median."""
    return bool(on_rates and off_rates) and statistics.median(on_rates) >= 0.97 * statistics.median(off_rates)


def check_overhead(rounds: int = 3) -> list[Row]:
    """Steps/s of a GPU job with gputop off and in each mode, alternated; and what one NVML sample costs."""
    modes = {
        "off": {"GPUTOP_DISABLE": "1"},
        "on (DDP's own sample rate)": {},
        "DDP sample rate 10": {"GPUTOP_DDP_SAMPLE_RATE": "10"},  # the rate gputop set before issue #54
        "CUDA events off": {"GPUTOP_CUDA_EVENTS": "0"},
    }
    rates: dict[str, list[float]] = {name: [] for name in modes}
    with recording() as (port, _):
        for round_no in range(rounds):
            names = list(modes)
            names = names[round_no % len(names) :] + names[: round_no % len(names)]  # rotate the order
            for name in names:
                rates[name].append(run_job("bf16", steps=400, port=port, env=modes[name]))
    rows = []
    base = statistics.median(rates["off"])
    for name in list(modes)[1:]:
        ratio, result = statistics.median(rates[name]) / base, overhead_agrees(rates[name], rates["off"])
        rows.append(Row(f"overhead: {name}", "≥ 0.97 × steps/s with gputop off (median of rounds)",
                        f"{ratio:.3f} × ({statistics.median(rates[name]):.1f} vs {base:.1f} steps/s, "
                        f"{rounds} rounds)", "pass" if result else "fail"))  # fmt: skip
    from gputop.collect.gpu.sampler import GpuSampler

    sampler = GpuSampler()
    sampler.sample()  # NVML init and the static facts
    times = []
    for _ in range(20):
        start = time.perf_counter()
        sampler.sample()
        times.append(time.perf_counter() - start)
    sampler.close()
    cost_ms = statistics.median(times) * 1000
    rows.append(Row("dashboard: one NVML sample of every GPU", "≤ 100 ms (the sampler runs once a second)",
                    f"{cost_ms:.1f} ms median of 20", "pass" if cost_ms <= 100 else "fail"))  # fmt: skip
    return rows


@dataclass(frozen=True)
class Check:
    """A registered check: the function, and how long it is expected to take.

    The estimates are reasoned, not yet measured (a 1-rank torchrun with CUDA and NCCL start-up is
    taken as ~10 s on a GPU node); ``--json`` records what each check really took, so the first run
    on a GPU corrects them.  The order is the order they run in: the cheap, independent ones first,
    the longest and least essential (``overhead``) last, where a short budget drops it.
    """

    run: Callable[[], list[Row]]
    estimate_s: float


def check_fsdp2() -> list[Row]:
    """A 1-rank NCCL FSDP2 job: reported, its phases from CUDA events, its loss's all-reduce timed, one context.

    One GPU runs one NCCL rank (NCCL refuses two ranks on a device) and FSDP2 issues no collective at
    world size 1, so the all-gathers and reduce-scatters themselves wait for a lease of several GPUs;
    the loss all-reduced each step is a collective on CUDA tensors all the same: counted with its bytes,
    and timed by events on the compute stream (docs/communication.md).
    """
    smi = read_smi()
    gpu = min(smi, key=lambda r: r.index)
    job: dict[str, Any] = {"steps": 200, "job_args": ("--wrap", "fsdp2", "--user-all-reduce", "--hold-s", "3")}
    with recording() as (port, path):
        result, on = one_context_on(job_contexts("bf16", port=port, **job), gpu, smi)
    report = report_of(path)
    rank = only_rank(report)
    collectives = {(c["kind"], c["group"]): c for c in rank.get("collectives") or ()}
    loss = collectives.get(("all_reduce", "world")) or collectives.get(("all_reduce", "dp"))
    from gputop.collect.recording import read
    from gputop.protocol import Event

    reasons = [e.value.message for e in read(path) if isinstance(e.value, Event) and e.value.kind == "not_measured"]
    phases = cuda_phases_read(rank)
    return [
        Row("FSDP2 on NCCL: contexts", f"the rank's process on GPU {gpu.index} only", on, result),
        Row("FSDP2 on NCCL: steps and phases", "200 steps; forward/backward from CUDA events (phases_from)",
            f"{rank['steps']} steps; forward {rank['forward_ms']}, backward {rank['backward_ms']} ms from "
            f"{rank['phases_from']}", "pass" if rank["steps"] == 200 and phases else "fail"),
        Row("a collective on CUDA tensors (the loss all-reduced)", "counted with its bytes; in flight and exposed "
            "timed by events", f"{loss}; reasons: {'; '.join(reasons) or 'none'}",
            "pass" if collective_timed(loss) else "fail"),
    ]  # fmt: skip


def cuda_phases_read(rank: dict[str, Any]) -> bool:
    """A rank's report has its forward and backward, each more than 0, from CUDA events."""
    return rank["phases_from"] == "cuda events" and bool(rank["forward_ms"]) and bool(rank["backward_ms"])


def collective_timed(row: dict[str, Any] | None) -> bool:
    """A report's collective row: counted (calls and bytes a step) and timed by events (in flight, exposed)."""
    if row is None:
        return False
    counted = row["calls_per_step"] >= 1 and row["bytes_per_step"] > 0
    return counted and bool(row["in_flight_ms"]) and row["exposed_ms"] is not None


def recorded_windows(path: Path) -> tuple[list[Any], list[str]]:
    """A recording's windows, and its ``not_measured`` reasons."""
    from gputop.collect.recording import read
    from gputop.protocol import Event, Window

    windows, reasons = [], []
    for entry in read(path):
        if isinstance(entry.value, Window):
            windows.append(entry.value)
        elif isinstance(entry.value, Event) and entry.value.kind == "not_measured":
            reasons.append(entry.value.message)
    return windows, reasons


EXPOSED_WAIT_MS = 20.0  # the side-stream delay of cuda-exposed-wait: long beside the job's own ~2-ms step
EXPOSED_WAIT_STEPS = 150


def check_cuda_exposed_wait() -> list[Row]:
    """A known side-stream delay the compute stream waits for as FSDP2 waits: gputop's exposed time is it.

    ``torch.cuda._sleep`` on a side stream that first waits for the compute stream, then
    ``current_stream().wait_event(end)`` inside ``tap.waits_for`` (the scope FSDP2's ``wait_for_unshard``
    runs in), once a step after backward; the delay's own length from events on the side stream.
    """
    with recording() as (port, path):
        printed = job_output("bf16", steps=EXPOSED_WAIT_STEPS, port=port,
                             job_args=("--wrap", "none", "--exposed-wait-ms", str(EXPOSED_WAIT_MS)))  # fmt: skip
    delay_ms = printed_number(printed, "side delay_ms")
    windows, reasons = recorded_windows(path)
    exposed_s = sum(c.exposed_s or 0.0 for w in windows for c in w.collectives if c.kind == "all_gather")
    exposed_ms = exposed_s * 1e3 / EXPOSED_WAIT_STEPS  # every step waited once, and every wait was read by the end
    ok = exposed_wait_agrees(exposed_ms, delay_ms)
    return [Row("cuda-exposed-wait: the compute stream's wait for a side-stream delay",
                "exposed a step within 10% of the delay, as measured by events on the side stream",
                f"exposed {exposed_ms:.2f} ms a step vs delay {delay_ms} ms; reasons: {'; '.join(reasons) or 'none'}",
                "pass" if ok else "fail")]  # fmt: skip


def exposed_wait_agrees(exposed_ms: float | None, delay_ms: float | None) -> bool:
    """The wait gputop read is the delay: both measured, the delay real (a job whose ``watch()`` returned None
    measures 0 against 0), and within 10%."""
    return bool(exposed_ms and delay_ms and delay_ms >= EXPOSED_WAIT_MS / 2) and within(exposed_ms, delay_ms, rel=0.10)


PHASE_STEPS, PROFILED_FROM = 150, 30  # the profiler and the windows compared: steps 30 on (cuBLAS warmed up)


def check_cuda_phases() -> list[Row]:
    """Forward and backward from gputop's CUDA events against torch.profiler's CUDA kernel time, same steps.

    A GPU-bound plain module (no DDP: its phases are gputop's own), profiled from step 30 on; gputop's
    windows that start at or after that step, their phases weighted by the steps they average.
    """
    job_args = ("--wrap", "none", "--profile-steps", f"{PROFILED_FROM}:{PHASE_STEPS}")
    with recording() as (port, path):
        printed = job_output("gpu_bound", steps=PHASE_STEPS, port=port, job_args=job_args)
    reference = (printed_number(printed, "profiler", 2), printed_number(printed, "profiler", 4))
    windows, reasons = recorded_windows(path)
    phased = [w for w in windows if w.phases_from == "cuda events" and w.ddp_steps
              and w.step_total - w.steps >= PROFILED_FROM]  # fmt: skip
    steps = sum(w.ddp_steps for w in phased)
    mine = tuple(sum(getattr(w, name) * w.ddp_steps for w in phased) * 1e3 / steps if steps else None
                 for name in ("forward_s", "backward_s"))  # fmt: skip
    said = "; ".join(reasons) or "none"
    return [
        Row(f"cuda-phases: {phase} from CUDA events", "within 10% of torch.profiler's CUDA kernel time a step",
            f"{_ms(measured)} vs {_ms(profiled)} ms over {steps} steps; reasons: {said}",
            "pass" if phase_agrees(measured, profiled) else "fail")
        for phase, measured, profiled in zip(("forward", "backward"), mine, reference, strict=True)
    ]  # fmt: skip


def phase_agrees(measured_ms: float | None, profiled_ms: float | None) -> bool:
    """A phase from gputop's CUDA events is the profiler's kernel time: both measured and not zero (no windows
    phased reads N/A, a profiler that saw no kernel 0), within 10%."""
    return bool(measured_ms and profiled_ms) and within(measured_ms, profiled_ms, rel=0.10)


def in_flight_agrees(each_ms: float | None, nccl_ms: float | None, syncs: float | None, refused: bool) -> bool:
    """An asynchronous all-reduce's time in flight is NCCL's own duration of it, and reading it synchronised
    nothing: present, NCCL's durations not refused, no synchronize by gputop's threads, within 50% (+0.05 ms)."""
    return bool(each_ms and each_ms > 0) and syncs == 0 and not refused and within(each_ms, nccl_ms, rel=0.5, abs_=0.05)


def _ms(value: float | None) -> str:
    return "N/A" if value is None else f"{value:.2f}"


def check_nccl_in_flight() -> list[Row]:
    """A 1-rank NCCL group, TORCH_NCCL_ENABLE_TIMING=1, an asynchronous all-reduce waited each step: in flight
    present (NCCL's own durations, read once complete), and nothing synchronised by gputop's threads."""
    with recording() as (port, path):
        printed = job_output("bf16", steps=200, port=port, env={"TORCH_NCCL_ENABLE_TIMING": "1"},
                             job_args=("--wrap", "none", "--async-all-reduce", "--count-syncs"))  # fmt: skip
    syncs, nccl_ms = printed_number(printed, "syncs"), printed_number(printed, "nccl duration_ms")
    rank = only_rank(report_of(path))
    _, reasons = recorded_windows(path)
    rows = {(c["kind"], c["group"]): c for c in rank.get("collectives") or ()}
    row = rows.get(("all_reduce", "world"))
    timed = row is not None and bool(row["in_flight_ms"]) and bool(row["calls_per_step"])
    each = row["in_flight_ms"] / row["calls_per_step"] if row is not None and timed else None
    refused = [r for r in reasons if "NCCL's own collective durations" in r]
    ok = in_flight_agrees(each, nccl_ms, syncs, bool(refused))
    return [Row("nccl-in-flight: an asynchronous all-reduce's time in flight",
                "present, within 50% (+0.05 ms) of NCCL's own duration the job read; no synchronize by gputop",
                f"{row}; {_ms(each)} ms each vs NCCL {nccl_ms} ms; syncs by other threads {syncs}; "
                f"reasons: {'; '.join(reasons) or 'none'}", "pass" if ok else "fail")]  # fmt: skip


MFU_STEPS, MFU_PROFILED = 400, (300, 330)
MFU_DTYPE = "bfloat16"  # the gpu_bound job's matmuls run under bf16 autocast: its peak is the datasheet's bf16


def mfu_agrees(mine: float | None, theirs: float | None, peak_is: str | None) -> bool:
    """gputop's MFU is the profiler's within 15%, and its peak is the one of the dtype the job ran (a peak chosen
    for float32 would make both figures agree and both wrong: they share the peak)."""
    shares = re.findall(r"(\d+)% (\w+)", peak_is or "")
    ran_as = bool(shares) and shares[0][1] == MFU_DTYPE and int(shares[0][0]) >= 90
    return ran_as and within(mine, theirs, rel=0.15)  # the profiler's steps come after every counting and warm-up


def check_mfu() -> list[Row]:
    """MFU against torch.profiler's own FLOP count, and the launch-bound job's MFU with its parallelism finding.

    A matmul-bound bf16 job: gputop's MFU within 15% of the one torch.profiler's FLOPs give over the wall time of
    its profiled steps, against the same peak (the report's).  A 32-wide MLP at batch 2: under 5%, and the
    parallelism finding.
    """
    rows = []
    job_args = ("--wrap", "none", "--profile-flops", f"{MFU_PROFILED[0]}:{MFU_PROFILED[1]}")
    with recording() as (port, path):
        printed = job_output("gpu_bound", steps=MFU_STEPS, port=port, job_args=job_args)
    rank = only_rank(report_of(path))
    flops, step_ms = printed_number(printed, "profiler", 2), printed_number(printed, "profiler", 4)
    peak, mine = rank.get("peak_flops_per_s"), rank.get("mfu_pct")
    theirs = 100 * flops / (step_ms / 1e3) / peak if flops and step_ms and peak else None
    rows.append(Row("mfu: a matmul-bound job against torch.profiler's FLOPs",
                    "MFU within 15% of the profiler's FLOPs a step over the same steps' time, the same peak",
                    f"{_ms(mine)}% vs {_ms(theirs)}% ({rank.get('flops_per_step')} vs {flops} FLOP a step, "
                    f"{rank.get('peak_is')}); {rank.get('work_note') or 'no note'}",
                    "pass" if mfu_agrees(mine, theirs, rank.get("peak_is")) else "fail"))  # fmt: skip
    report = recorded_job("launch_bound", steps=3000)
    rank = only_rank(report)
    small, fired = rank.get("mfu_pct"), "parallelism" in causes(report)
    rows.append(Row("mfu: a launch-bound batch-2 job", "MFU under 5% and the parallelism finding",
                    f"MFU {_ms(small)}%; parallelism {'fired' if fired else 'silent'}",
                    "pass" if small is not None and small < 5 and fired else "fail"))  # fmt: skip
    return rows


# The order they run in: the CUDA path's rows first (the code that has never run anywhere else), then what NVML
# and the GPU's own counters are compared with, then ``overhead``, the longest, last, where a short budget drops it.
CHECKS: dict[str, Check] = {
    "cuda-exposed-wait": Check(check_cuda_exposed_wait, 20),  # one recorded job: 150 steps of ~22 ms
    "cuda-phases": Check(check_cuda_phases, 25),  # one recorded GPU-bound job of 150 steps, 120 of them profiled
    "nccl-in-flight": Check(check_nccl_in_flight, 15),  # one recorded 200-step job
    "mfu": Check(check_mfu, 40),  # a recorded 400-step matmul-bound job, 30 of them profiled; a 3000-step tiny one
    "fsdp2": Check(check_fsdp2, 25),  # one recorded FSDP2 job watched by nvidia-smi
    "nvml": Check(check_nvml_vs_smi, 20),  # 5 s for the load to start, 10 paired readings a second apart
    "nvml_processes": Check(check_nvml_processes_and_links, 10),
    "ddp_times": Check(check_ddp_timings, 20),  # one recorded 2,000-step job
    "step_time": Check(check_gpu_step_time, 35),  # a GPU-bound and a launch-bound recorded job
    "join": Check(check_join, 30),  # two recorded 100-step jobs
    "contexts": Check(check_cuda_contexts, 60),  # four jobs watched by nvidia-smi, each held 3 s after
    "rules": Check(check_rules, 75),  # a 20-s demo and three recorded jobs
    "overhead": Check(check_overhead, 130),  # 3 rounds of 4 jobs, alternated
}
# The CUDA path's rows: they run first, and the device call's budget (scripts/gpu-device) holds every one of them.
CUDA_ROWS = ("cuda-exposed-wait", "cuda-phases", "nccl-in-flight", "mfu", "fsdp2")


def run_check(name: str) -> list[Row]:
    """A check's rows; a check that breaks is one row saying why, and the others still run."""
    try:
        return CHECKS[name].run()
    except Exception as exc:
        return [Row(name, "(see docs/gpu.md)", "-", f"error: {type(exc).__name__}: {str(exc)[:300]}")]


def skipped(name: str, left_s: float) -> Row:
    """The row of a check the budget had no room for."""
    return Row(name, "(see docs/gpu.md)", "-", f"skipped: ~{CHECKS[name].estimate_s:.0f} s needed, {left_s:.0f} s of "
               "the budget left (run it alone with --only)")  # fmt: skip


def machine_line() -> str:
    import torch

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True)  # fmt: skip
    gpus = "; ".join(line.strip() for line in smi.stdout.splitlines() if line.strip())
    return f"{time.strftime('%Y-%m-%d')}, {gpus}, torch {torch.__version__} (CUDA {torch.version.cuda})"


def main(argv: Sequence[str] | None = None) -> int:
    global _deadline, _job_log
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(CHECKS), help="run only these checks")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument("--output", type=Path, default=Path("gpu-check.md"), help="markdown table (gpu-check.md)")
    parser.add_argument("--json", type=Path, help="also write the rows, each check's seconds and the machine here")
    parser.add_argument("--job-log", type=Path, help="append every job's output to this file")
    parser.add_argument(
        "--budget-s", type=float, help="stop starting checks that would not finish in this many seconds"
    )
    args = parser.parse_args(argv)
    if args.list:
        for name, check in CHECKS.items():
            print(f"{name:17} ~{check.estimate_s:4.0f} s  {(check.run.__doc__ or '').strip().splitlines()[0]}")
        return 0
    problem = why_no_gpu()
    if problem is not None:
        print(f"gpu-check: no GPU to check on: {problem}", file=sys.stderr)
        return EXIT_NO_GPU
    start = time.monotonic()
    _deadline = None if args.budget_s is None else start + args.budget_s
    _job_log = args.job_log
    rows: list[Row] = []
    took: dict[str, float | None] = {}
    machine = machine_line()
    header = f"`make gpu-check` on {machine}\n\n"

    def write() -> None:  # after every check: a budget or a timeout that ends the call leaves every finished row
        args.output.write_text(header + markdown_table(rows), encoding="utf-8")
        if args.json is not None:
            record = {"machine": machine, "budget_s": args.budget_s, "seconds": round(time.monotonic() - start, 1),
                      "checks": {name: {"seconds": s, "estimate_s": CHECKS[name].estimate_s}
                                 for name, s in took.items()},
                      "rows": [dataclasses.asdict(row) for row in rows]}  # fmt: skip
            args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")

    for name in args.only or list(CHECKS):
        left_s = None if _deadline is None else _deadline - time.monotonic()
        if left_s is not None and left_s < CHECKS[name].estimate_s:
            print(f"gpu-check: {name} skipped ({left_s:.0f} s left)", file=sys.stderr, flush=True)
            rows.append(skipped(name, left_s))
            took[name] = None
            continue
        print(f"gpu-check: {name} …", file=sys.stderr, flush=True)
        check_start = time.monotonic()
        rows += run_check(name)
        took[name] = round(time.monotonic() - check_start, 1)
        print(f"gpu-check: {name} took {took[name]} s", file=sys.stderr, flush=True)
        write()
    write()
    print(header + markdown_table(rows))
    print(f"gpu-check: {sum(r.passed for r in rows)} of {len(rows)} passed; table written to {args.output}")
    return 0 if all(r.passed for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
