"""Shared fixtures: real collectors on free ports and real torchrun jobs."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from gputop import auth
from gputop.address import Address
from gputop.collect.server import Collector
from gputop.collect.store import Store
from gputop.model.snapshot import Snapshot

JOBS = Path(__file__).parent / "jobs"
needs_torch = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0,
    reason="torch is not installed",
)


TOKEN = "correct horse battery staple"  # the shared token of the `guarded` collector


@pytest.fixture
def guarded() -> Iterator[Collector]:
    """A real collector on loopback that demands TOKEN."""
    c = Collector(Store(), Address(port=0), security=auth.Security(token=TOKEN))
    c.start()
    yield c
    c.stop()


@pytest.fixture
def collector() -> Iterator[Collector]:
    """A real collector on a free loopback port."""
    c = Collector(Store(), Address(port=0))
    c.start()
    yield c
    c.stop()


def torchrun(script: str, *args: str, port: int | None, nproc: int = 2, env: dict[str, str] | None = None,
             **popen: object) -> subprocess.Popen[str]:  # fmt: skip
    """Start a real `torchrun --standalone` job reporting to ``port``."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("GPUTOP_SOCKET", None)
    if port is not None:
        full_env["GPUTOP_PORT"] = str(port)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(JOBS / script), *args]  # fmt: skip
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


def wait_for(predicate: Callable[[], bool], timeout_s: float = 30.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def snapshot_of(collector: Collector) -> Snapshot:
    return collector.store.snapshot(time.time())


def window_count(collector: Collector) -> int:
    """Windows received so far, over every rank."""
    return sum(len(v.windows) for v in snapshot_of(collector).all_ranks())
