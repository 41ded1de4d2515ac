"""Shared fixtures: real collectors on free ports and real torchrun jobs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

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
    """Wait for a job; fail the test with its output if it did not exit 0."""
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"job timed out:\n{out[-3000:]}")
    assert proc.returncode == 0, f"job exited {proc.returncode}:\n{out[-3000:]}"
    return out


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
