"""Children from /proc: the rank's workers found without scanning the machine, zombies left out."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gputop.processes.procfs import children_of, descendants_of

pytestmark = pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children"),
                                reason="this kernel has no /proc/<pid>/task/<tid>/children")  # fmt: skip

GRANDPARENT = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"
)


def test_children_and_grandchildren_are_found() -> None:
    child = subprocess.Popen([sys.executable, "-c", GRANDPARENT])
    try:
        deadline = time.monotonic() + 10
        while not children_of(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        children = children_of(child.pid)
        assert children is not None and len(children) == 1, children
        (grandchild,) = children
        assert child.pid in (children_of(os.getpid()) or [])
        assert descendants_of(child.pid) == [grandchild]
    finally:
        for pid in descendants_of(child.pid) or []:
            os.kill(pid, 9)
        child.kill()
        child.wait()


def test_an_exited_child_not_yet_reaped_is_not_a_worker() -> None:
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _state(zombie.pid) != "Z":
            time.sleep(0.05)
        assert _state(zombie.pid) == "Z"
        assert zombie.pid not in (children_of(os.getpid()) or [])
    finally:
        zombie.wait()


def test_a_process_that_is_gone_has_no_children() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert children_of(gone.pid) == []


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        return handle.read().rsplit(b")", 1)[1].split()[0].decode()
