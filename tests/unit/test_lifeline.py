"""A process tied to another leaves when that one exits, even with its main thread stuck."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from gputop.processes import lifeline
from tests.support.collectors import wait_for
from tests.support.processes import exited_pid

# Tied to the pid in argv[1], then stuck for good in a blocking read that no signal ends.
STUCK = """
import os, sys
from gputop.processes import lifeline
if not lifeline.leave_with(int(sys.argv[1]), code=7):
    sys.exit(3)
print("tied", flush=True)
r, _ = os.pipe()
os.read(r, 1)
"""


def test_a_process_stuck_in_a_read_leaves_when_the_one_it_is_tied_to_exits() -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    tied = subprocess.Popen([sys.executable, "-c", STUCK, str(other.pid)], stdout=subprocess.PIPE, text=True)
    try:
        assert tied.stdout is not None and tied.stdout.readline().strip() == "tied"
        time.sleep(0.3)
        assert tied.poll() is None, "it left while the other still ran"
        other.kill()
        other.wait()
        assert tied.wait(10) == 7
    finally:
        for proc in (other, tied):
            proc.kill()
            proc.wait()


def test_tying_to_a_process_that_is_gone_says_so_and_starts_nothing() -> None:
    gone = exited_pid()
    assert not psutil.pid_exists(gone)
    assert lifeline.leave_with(gone) is False


def test_the_poll_fallback_leaves_too(monkeypatch) -> None:
    """Without pidfd_open (not Linux, an old kernel), a poll finds the exit."""
    monkeypatch.delattr(os, "pidfd_open")  # the os module lifeline asks
    monkeypatch.setattr(lifeline, "POLL_S", 0.05)
    left: list[int] = []
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert lifeline.leave_with(other.pid, code=5, leave=left.append)
        time.sleep(0.2)
        assert left == []
        other.kill()
        other.wait()
        assert wait_for(lambda: left == [5], timeout_s=5), left
    finally:
        other.kill()
        other.wait()
