"""A bye on SIGTERM that delays nothing (gputop/reporter/sigterm.py): real processes, real signals.

A main thread "blocked in C" is blocked on a pthread mutex it already holds, through ctypes: a wait that never
returns to the interpreter and that no signal interrupts, as a collective's wait in C++ (DDP's reducer waits
for its all-reduce so).  Each child writes the bye it would send, and on which thread, to a file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

CHILD = """
import asyncio, ctypes, os, signal, sys, threading, time
from gputop.reporter.ending import Ending
from gputop.reporter.sigterm import SigtermBye

out = sys.argv[1]
ending = Ending()

def say_bye(bound_s):  # what the reporter does: the last window and the bye, within bound_s
    time.sleep(float(os.environ.get("BYE_TAKES_S", "0")))
    with open(out, "a") as fh:
        fh.write(f"bye {ending.how} {ending.detail} from {threading.current_thread().name} within {bound_s}\\n")

def blocked_in_c():  # a C++ mutex's wait: never back in the interpreter, not interrupted by a signal
    mutex = ctypes.create_string_buffer(64)  # zeroes: PTHREAD_MUTEX_INITIALIZER, a normal mutex
    libc = ctypes.CDLL(None)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)

def theirs(signum, frame):
    print("their handler", flush=True)
    sys.exit(3)

bye = SigtermBye(ending, say_bye)
{before}
print(f"ready {bye.install()} {bye.why_not}", flush=True)
{body}
"""


@dataclass
class Ended:
    status: int | None  # the child's wait status as subprocess gives it (-15: killed by SIGTERM); None: alive
    after_s: float  # from the signal to the child's end (or to the give-up)
    said: str  # its first line: whether it installed, and why not
    byes: str
    out: str


def run_child(
    tmp_path: Path, body: str, before: str = "", sig: int | None = signal.SIGTERM, bye_takes_s: float = 0.0
) -> Ended:
    """Start a child that installs a SigtermBye after ``before``, then runs ``body``; signal it once ready."""
    out = tmp_path / "byes"
    code = CHILD.replace("{before}", textwrap.dedent(before)).replace("{body}", textwrap.dedent(body))
    env = {**os.environ, "BYE_TAKES_S": str(bye_takes_s)}
    child = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env)  # fmt: skip
    assert child.stdout is not None
    said = child.stdout.readline().strip()
    time.sleep(0.2)  # into the body
    sent = time.monotonic()
    if sig is not None:
        child.send_signal(sig)
    try:
        status: int | None = child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        status = None
        child.kill()
        child.wait()
    after_s = time.monotonic() - sent
    rest = child.stdout.read()  # from the stream readline() buffered, not the pipe: what it printed is all there
    child.stdout.close()
    return Ended(status, after_s, said, out.read_text() if out.exists() else "", rest)


def test_a_main_thread_blocked_in_c_says_bye_from_the_thread_and_dies_of_sigterm(tmp_path: Path) -> None:
    ended = run_child(tmp_path, "blocked_in_c()")
    assert ended.said == "ready True", ended
    assert ended.status == -signal.SIGTERM, f"not killed by SIGTERM within 10 s of it: {ended}"
    assert ended.byes == "bye signal SIGTERM from gputop-sigterm within 0.5\n", ended
    print(f"blocked in C: dead {ended.after_s:.3f} s after SIGTERM")


def test_a_main_thread_in_the_interpreter_says_bye_itself_and_dies_of_sigterm(tmp_path: Path) -> None:
    ended = run_child(tmp_path, "while True: pass")
    assert ended.status == -signal.SIGTERM, ended
    # Whichever heard it first said bye, once.
    assert ended.byes.startswith("bye signal SIGTERM from ") and ended.byes.count("\n") == 1, ended


def test_a_main_thread_back_from_c_during_the_bye_waits_for_it_and_still_dies_of_sigterm(tmp_path: Path) -> None:
    """The thread says bye (slowly here); the main thread comes back from C meanwhile and would exit 1 (as a
    rank whose peer died in the collective does, on gloo's error): it waits for the bye, the process dies of
    SIGTERM.  Margins a loaded CI machine keeps: the thread has 0.6 s to take the bye before the main thread is back
    (with 0.1 s, a starved thread was once late and the main thread's own handler said it)."""
    ended = run_child(tmp_path, 'ctypes.CDLL(None).system(b"sleep 0.8")\nsys.exit(1)', bye_takes_s=1.2)
    assert (ended.status, ended.byes) == (-signal.SIGTERM, "bye signal SIGTERM from gputop-sigterm within 0.5\n"), ended


def test_a_handler_the_script_set_before_is_left_as_it_was_and_runs(tmp_path: Path) -> None:
    ended = run_child(tmp_path, "time.sleep(20)", before="signal.signal(signal.SIGTERM, theirs)")
    assert ended.said.startswith("ready False the script handles SIGTERM itself"), ended
    assert (ended.status, ended.byes, ended.out) == (3, "", "their handler\n"), ended


def test_a_handler_the_script_sets_after_takes_over_and_gputop_does_nothing(tmp_path: Path) -> None:
    ended = run_child(tmp_path, "signal.signal(signal.SIGTERM, theirs)\ntime.sleep(20)")
    assert ended.said == "ready True", ended
    assert (ended.status, ended.byes, ended.out) == (3, "", "their handler\n"), ended


def test_a_handler_set_after_that_calls_ours_as_the_one_before_keeps_the_process_alive(tmp_path: Path) -> None:
    """Lightning's way: its handler notes SIGTERM, calls the handler that was there, and training stops on its
    own terms (or goes on, for SLURM's requeue).  Ours stands for the default, which no handler calls: it does
    nothing, and the process goes on."""
    body = """
        previous = signal.getsignal(signal.SIGTERM)
        stopping = []
        def lightnings(signum, frame):
            stopping.append(signum)
            if callable(previous):
                previous(signum, frame)
        signal.signal(signal.SIGTERM, lightnings)
        while not stopping:
            time.sleep(0.01)
        time.sleep(1.0)  # the thread, had it acted on the byte in our pipe, would have ended the process by now
        print("stopped on its own terms")
    """
    ended = run_child(tmp_path, body)
    assert (ended.status, ended.byes, ended.out) == (0, "", "stopped on its own terms\n"), ended


def test_an_ignored_sigterm_stays_ignored(tmp_path: Path) -> None:
    ended = run_child(tmp_path, "time.sleep(1)", before="signal.signal(signal.SIGTERM, signal.SIG_IGN)")
    assert ended.said.startswith("ready False"), ended
    assert (ended.status, ended.byes) == (0, ""), ended


def test_a_wakeup_fd_held_before_leaves_sigterm_its_default(tmp_path: Path) -> None:
    before = "loop = asyncio.new_event_loop()\nloop.add_signal_handler(signal.SIGINT, lambda: None)"
    ended = run_child(tmp_path, "blocked_in_c()", before=before)
    assert ended.said == "ready False the interpreter's signal wakeup fd is another's (an asyncio loop's)", ended
    assert (ended.status, ended.byes) == (-signal.SIGTERM, ""), ended


def test_a_wakeup_fd_taken_after_puts_sigterm_back_to_its_default_first(tmp_path: Path) -> None:
    """An asyncio loop that handles a signal takes the wakeup fd: gputop's thread would no longer hear SIGTERM,
    so SIGTERM has its default again, and a rank blocked in C still dies of it at once."""
    body = "loop = asyncio.new_event_loop()\nloop.add_signal_handler(signal.SIGINT, lambda: None)\nblocked_in_c()"
    ended = run_child(tmp_path, body)
    assert ended.said == "ready True", ended
    assert (ended.status, ended.byes) == (-signal.SIGTERM, ""), f"still alive 10 s after SIGTERM: {ended}"


def test_uninstalled_at_exit_sigterm_ends_a_stuck_teardown_at_once(tmp_path: Path) -> None:
    ended = run_child(tmp_path, "bye.uninstall()\nblocked_in_c()")
    assert (ended.status, ended.byes) == (-signal.SIGTERM, ""), ended


def test_a_forked_child_dies_of_sigterm_as_before_and_its_parent_goes_on(tmp_path: Path) -> None:
    """A DataLoader worker forked from the rank: SIGTERM ends it by the default action, and the byte it would
    have written into the parent's pipe does not end the parent."""
    body = """
        import warnings  # Python 3.12+ warns that this process has threads (the reporter's), as a DataLoader's fork
        warnings.filterwarnings("ignore", message=".*use of fork.* may lead to deadlocks", category=DeprecationWarning)
        child = os.fork()
        if child == 0:
            blocked_in_c()
        time.sleep(0.5)
        os.kill(child, signal.SIGTERM)
        _, status = os.waitpid(child, 0)
        time.sleep(0.5)  # the parent's thread, had it heard the child's SIGTERM, would have acted by now
        print(f"child {'killed by ' + signal.Signals(os.WTERMSIG(status)).name if os.WIFSIGNALED(status) else status}")
    """
    ended = run_child(tmp_path, body, sig=None)
    assert (ended.status, ended.byes, ended.out) == (0, "", "child killed by SIGTERM\n"), ended


def test_off_the_main_thread_nothing_is_installed(tmp_path: Path) -> None:
    body = """
        other = SigtermBye(ending, say_bye)
        thread = threading.Thread(target=other.install)
        thread.start()
        thread.join()
        print(other.installed, other.why_not)
    """
    ended = run_child(tmp_path, body, sig=None)
    assert ended.out == "False gputop was started off the main thread, where Python cannot set a signal's handler\n", (
        ended
    )
