"""A process that must not outlive another leaves when that one is gone, whatever its own threads are doing.

The node sampler must not outlive the rank that started it, and a demo rank must
not outlive the ``gputop demo`` that started its job.  PR_SET_PDEATHSIG covers
only the direct parent (and only its forking thread), and a loop that checks its
parent covers only a process whose main thread comes round again: one stuck in a
driver call, a blocked write or the interpreter's own teardown never does.  So a
daemon thread waits on the other process (a pidfd, Linux 5.3+; else a poll a
second) and ends this process with ``os._exit`` when it exits.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable

POLL_S = 1.0  # without a pidfd: how often the other process is looked for


def leave_with(pid: int, *, code: int = 0, leave: Callable[[int], object] = os._exit) -> bool:
    """From now on, ``leave(code)`` as soon as process ``pid`` has exited.

    Returns False, having started nothing, when ``pid`` is gone already: the
    caller should leave at once, since its reason to run went with it.
    """
    try:
        fd: int | None = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # no pidfd_open here (not Linux, an old kernel): poll
        fd = None
        if not _alive(pid):
            return False

    def watch() -> None:
        if fd is None or not _wait_for_exit(fd):
            while _alive(pid):
                time.sleep(POLL_S)
        leave(code)

    threading.Thread(target=watch, name="gputop-lifeline", daemon=True).start()
    return True


def _wait_for_exit(pidfd: int) -> bool:
    """Block until the pidfd's process has exited (it reads as ready then); False if poll() fails."""
    try:
        poller = select.poll()  # not select(): a descriptor past 1023 is fine here
        poller.register(pidfd, select.POLLIN)
        poller.poll()
    except OSError:
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # gone, or someone else's process by now
        return False
    return True
