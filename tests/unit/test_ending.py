"""How a rank's process ends, as its bye says it (gputop/reporter/ending.py): real processes, real signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

CHILD = """
import atexit, os, signal, sys, time
from gputop.reporter.ending import Ending

out = sys.argv[1]
ending = Ending()

def flush():  # what the reporter's exit does: its bye says how
    with open(out, "a") as fh:
        fh.write(f"bye {ending.how} {ending.detail}\\n")

atexit.register(flush)
ending.install()
print("ready", flush=True)
{body}
"""


def run_child(tmp_path: Path, body: str, sig: int | None = None) -> tuple[int, str, str]:
    """Start a child that installs an Ending, optionally signal it once it is ready: (status, byes, stderr)."""
    out = tmp_path / "byes"
    code = CHILD.replace("{body}", textwrap.dedent(body))
    child = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    if sig is not None:
        child.send_signal(sig)
    _, err = child.communicate(timeout=30)
    return child.returncode, out.read_text() if out.exists() else "", err


def test_a_script_that_ends_says_it_finished(tmp_path: Path) -> None:
    assert run_child(tmp_path, "pass")[:2] == (0, "bye exit \n")


def test_an_exception_that_ends_the_script_is_named_and_still_printed(tmp_path: Path) -> None:
    status, byes, err = run_child(tmp_path, 'raise RuntimeError("CUDA out of memory")')
    assert status == 1
    assert byes == "bye exception RuntimeError: CUDA out of memory\n"
    assert "Traceback" in err and "RuntimeError: CUDA out of memory" in err  # the hook that was there still ran


def test_ctrl_c_reads_as_the_signal_it_is(tmp_path: Path) -> None:
    status, byes, _ = run_child(tmp_path, "time.sleep(30)", sig=signal.SIGINT)
    assert status == -signal.SIGINT and byes == "bye signal SIGINT\n"  # Python dies of SIGINT, as it should
