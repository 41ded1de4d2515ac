"""Leave when the terminal does: a dashboard whose terminal has hung up must not live on.

Closing a terminal normally sends SIGHUP, which ends gputop like any program.
Some ways of losing one send none: ``tmux kill-session`` on a pane running
``make demo`` (make, the session leader, lived on), an SSH connection that
drops under ``nohup``.  Textual's input thread then spins on the hung-up
terminal (a read returns end-of-file at once: Textual pull request 6690) and
its writer thread blocks the UI thread for good.  Seen here: a forgotten
``gputop demo`` used 41% of a core for 75 minutes while its 2 ranks trained
on, unwatched, slowing everything else on the machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable

CHECK_EVERY_S = 1.0
GRACE_S = 3.0  # for a clean exit (the caller's cleanup runs) before the process ends itself


def exit_when_the_terminal_goes(
    fd: int, exit_app: Callable[[], None], *, every_s: float = CHECK_EVERY_S, grace_s: float = GRACE_S
) -> threading.Thread | None:
    """Watch ``fd`` from a daemon thread; once it is no longer a terminal, exit as a hangup would.

    ``exit_app`` is asked first (from this thread: it must be thread-safe), so
    the caller's cleanup runs; if the process is still here ``grace_s`` later
    (the UI thread is stuck writing to the dead terminal), it ends itself with
    SIGTERM.  The demo's job goes with it: it was started with a parent-death
    signal.  Returns None when ``fd`` is not a terminal to begin with.
    """
    if not os.isatty(fd):
        return None

    def watch() -> None:
        while os.isatty(fd):
            time.sleep(every_s)
        with contextlib.suppress(Exception):
            exit_app()
        time.sleep(grace_s)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(128 + signal.SIGHUP)  # a SIGTERM handler that did not end the process

    thread = threading.Thread(target=watch, name="gputop-terminal-watch", daemon=True)
    thread.start()
    return thread
