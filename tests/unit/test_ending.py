"""How a rank's process ends, as its bye says it (gputop/reporter/ending.py): real processes, real signals."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

CHILD = """
import os, signal, sys, time
from gputop.reporter.ending import Ending

out = sys.argv[1]
ending = Ending()

def flush():
    with open(out, "a") as fh:
        fh.write(f"flush {ending.how} {ending.detail}\\n")

{setup}
ending.install(flush)
print("ready", flush=True)
{body}
"""


def run_child(tmp_path: Path, body: str, setup: str = "", sig: int | None = None) -> tuple[int, str, str]:
    """Start a child that installs an Ending, optionally signal it once it is ready: (status, flushes, stderr)."""
    out = tmp_path / "flushes"
    code = CHILD.replace("{setup}", textwrap.dedent(setup)).replace("{body}", textwrap.dedent(body))
    child = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    if sig is not None:
        child.send_signal(sig)
    _, err = child.communicate(timeout=30)
    return child.returncode, out.read_text() if out.exists() else "", err


def test_sigterm_under_the_default_flushes_first_then_dies_of_it(tmp_path: Path) -> None:
    """What scancel, a container's stop and kill send: the bye goes out, and the exit status is the signal's."""
    status, flushes, _ = run_child(tmp_path, "time.sleep(30)", sig=signal.SIGTERM)
    assert status == -signal.SIGTERM
    assert flushes == "flush signal SIGTERM\n"


def test_the_scripts_own_handler_runs_first_and_the_process_goes_on(tmp_path: Path) -> None:
    """A script that checkpoints on SIGTERM and leaves later: its handler, at once; no flush until it exits."""
    setup = """
        def mine(signum, frame):
            with open(out, "a") as fh:
                fh.write("mine\\n")
        signal.signal(signal.SIGTERM, mine)
    """
    body = """
        deadline = time.time() + 20
        while time.time() < deadline and not os.path.exists(out):
            time.sleep(0.01)
        print(ending.how, ending.detail, file=sys.stderr)
    """
    status, flushes, err = run_child(tmp_path, body, setup=setup, sig=signal.SIGTERM)
    assert status == 0 and flushes == "mine\n", (flushes, err)
    assert err.strip() == "signal SIGTERM"


def test_an_ignored_sigterm_stays_ignored(tmp_path: Path) -> None:
    setup = "signal.signal(signal.SIGTERM, signal.SIG_IGN)"
    body = """
        time.sleep(0.5)
        print(ending.how, file=sys.stderr)
    """
    started = time.monotonic()
    status, flushes, err = run_child(tmp_path, body, setup=setup, sig=signal.SIGTERM)
    assert status == 0 and flushes == "" and err.strip() == "exit", err
    assert time.monotonic() - started < 20


def test_an_exception_that_ends_the_script_is_named_and_still_printed(tmp_path: Path) -> None:
    body = """
        import atexit
        atexit.register(flush)
        raise RuntimeError("CUDA out of memory")
    """
    status, flushes, err = run_child(tmp_path, body)
    assert status == 1
    assert flushes == "flush exception RuntimeError: CUDA out of memory\n"
    assert "Traceback" in err and "RuntimeError: CUDA out of memory" in err  # the hook that was there still ran


def test_ctrl_c_reads_as_the_signal_it_is(tmp_path: Path) -> None:
    setup = """
        import atexit
        atexit.register(flush)
    """
    status, flushes, _ = run_child(tmp_path, "time.sleep(30)", setup=setup, sig=signal.SIGINT)
    assert status == -signal.SIGINT and flushes == "flush signal SIGINT\n"  # Python dies of SIGINT, as it should
