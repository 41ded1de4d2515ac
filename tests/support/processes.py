"""Real processes a test starts: torchrun jobs (the scripts in ``jobs/``), and what to do when one hangs."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import IO

import pytest

JOBS = Path(__file__).parent / "jobs"
LAUNCH_RANKS = Path(__file__).parent / "launch_ranks.py"
# Found, not imported: importing torch costs seconds, and the tests that need it run it in their jobs.
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


def gputop(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m gputop ARGS`, as a user runs it, its output kept."""
    return subprocess.run([sys.executable, "-m", "gputop", *args], capture_output=True, text=True, timeout=timeout_s)


def run_script(code: str, port: int | None, **env: str) -> subprocess.CompletedProcess[str]:
    """Python ``code`` (dedented) in a fresh interpreter reporting to ``port`` (None: GPUTOP_PORT as it is)."""
    full_env = {**os.environ, **env}
    if port is not None:
        full_env["GPUTOP_PORT"] = str(port)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def torchrun(script: str, *args: str, port: int | None, nproc: int = 2, env: dict[str, str] | None = None,
             **popen: object) -> subprocess.Popen[str]:  # fmt: skip
    """Start a real `torchrun --standalone` job reporting to ``port``: its agent, its rendezvous, its ranks."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return _start(launcher, script, args, port, env, popen)


def launch(script: str, *args: str, port: int | None, nproc: int = 2, env: dict[str, str] | None = None,
           **popen: object) -> subprocess.Popen[str]:  # fmt: skip
    """Start ``nproc`` real ranks of a job reporting to ``port``, launched directly as srun launches them.

    The same ranks, process group and DDP as under torchrun without its agent's
    start-up (~2.5 s a job here: ``launch_ranks.py``).  Tests of what gputop does
    with torchrun itself (its run id, its agent's signals) use ``torchrun``.
    """
    return _start([sys.executable, str(LAUNCH_RANKS), str(nproc)], script, args, port, env, popen)


def _start(launcher: list[str], script: str, args: tuple[str, ...], port: int | None, env: dict[str, str] | None,
           popen: dict[str, object]) -> subprocess.Popen[str]:  # fmt: skip
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("GPUTOP_SOCKET", None)
    if port is not None:
        full_env["GPUTOP_PORT"] = str(port)
    cmd = [*launcher, str(JOBS / script), *args]
    return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)  # type: ignore[call-overload]


def finish(proc: subprocess.Popen[str], timeout_s: float = 120.0) -> str:
    """Wait for a job and the end of its output; fail the test with its output if it did not exit 0.

    A job that exited while something it started still holds its output open
    (a process that outlived it) fails too, naming that process, instead of
    waiting on the pipe for good.
    """
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        exited = proc.poll()
        holders = pipe_holders(proc.stdout)
        proc.kill()
        for pid, _ in holders:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            out = "(its output could not be read to the end)"
        held = "".join(f"\n  pid {pid}: {what}" for pid, what in holders)
        state = "running" if exited is None else f"exited {exited}, but its output was still held open by:{held}"
        pytest.fail(f"job timed out after {timeout_s:.0f} s ({state}):\n{out[-3000:]}")
    assert proc.returncode == 0, f"job exited {proc.returncode}:\n{out[-3000:]}"
    return out


def pipe_holders(pipe: IO[str] | None) -> list[tuple[int, str]]:
    """The other processes that hold the far end of ``pipe`` open, each with its command line, state and wait."""
    if pipe is None:
        return []
    target = f"pipe:[{os.fstat(pipe.fileno()).st_ino}]"
    found = []
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit() or int(pid_dir.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) == target for fd in (pid_dir / "fd").iterdir()):
                cmdline = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                state = next(line for line in (pid_dir / "status").read_text().splitlines() if line.startswith("State"))
                found.append((int(pid_dir.name), f"{cmdline} [{state}, wchan {(pid_dir / 'wchan').read_text()}]"))
    return found


def exited_pid() -> int:
    """The pid of a process that has exited and been reaped (for code told to follow a process that is gone)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def free_port() -> int:
    """A loopback TCP port nothing listens on now (for a server the test starts as a subprocess)."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = int(probe.getsockname()[1])
    probe.close()
    return port
