"""The dashboard lowers its own CPU priority, never the job's: run in a child process, as a user starts it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import os, sys
from gputop.processes.yielding import yield_to_training
done = yield_to_training()
print(os.nice(0), "|", "; ".join(done))
"""


def run(env: dict[str, str], *, new_session: bool) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-c", SCRIPT], env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=60, start_new_session=new_session, check=True)  # fmt: skip
    nice, _, said = out.stdout.partition("|")
    return int(nice), said.strip()


def test_a_dashboard_in_a_terminal_of_its_own_lowers_itself_and_its_session() -> None:
    before = os.nice(0)
    nice, said = run({}, new_session=True)
    assert nice == max(before, 10), said
    if Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1":
        assert "session group nice 10" in said


def test_a_session_that_holds_other_processes_keeps_its_group_priority() -> None:
    """`torchrun ... & gputop` in one shell: lowering the session's group would lower the job too."""
    # The "job": a process in this session that is not the dashboard's ancestor.  Without it the
    # session may hold only the dashboard's ancestors (make, pytest), and then lowering it is right.
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _, said = run({}, new_session=False)
    finally:
        job.kill()
        job.wait()
    assert "session group" not in said


def test_gputop_nice_0_turns_it_off() -> None:
    before = os.nice(0)
    nice, said = run({"GPUTOP_NICE": "0"}, new_session=True)
    assert (nice, said) == (before, "")
