"""Linux process facts for gputop's threads: children from /proc, and thread names ps can see.

A process's children come from /proc, without scanning every process on the machine.

``psutil.Process.children`` builds a map of every process's parent from
``/proc/*/stat``: on a shared server with thousands of processes that is
milliseconds of CPU each time, and both the reporter (its DataLoader workers)
and the host sampler (each rank's workers) ask every second.  Linux lists a
thread's children in ``/proc/<pid>/task/<tid>/children`` (kernels with
CONFIG_PROC_CHILDREN, which distributions enable), so reading the rank's own
threads' lists costs a few small reads.  Where that file does not exist the
functions return None and callers fall back to psutil.  Pure reads, no psutil,
cheap to import: the reporter uses it too.
"""

from __future__ import annotations

import contextlib
import os
import sys

_PROC = "/proc"
_PR_SET_NAME = 15  # prctl option, linux/prctl.h


def name_this_thread(name: str) -> None:
    """Give the calling thread an OS-level name (15 bytes), so ``top -H``, py-spy and /proc show it.

    Python's thread names live only inside Python; with this a user who sees a
    busy thread in a training process can tell it is gputop's.  Best effort.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):  # no libc, no prctl: the name is a courtesy
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_NAME, name.encode()[:15])


def children_of(pid: int) -> list[int] | None:
    """Live (not zombie) direct children of ``pid``, or None where /proc cannot say."""
    task_dir = f"{_PROC}/{pid}/task"
    try:
        tasks = os.listdir(task_dir)
    except FileNotFoundError:
        return []  # the process is gone: no children
    except OSError:
        return None
    if not os.path.exists(f"{task_dir}/{pid}/children"):
        return None  # a kernel without CONFIG_PROC_CHILDREN
    found: set[int] = set()
    for tid in tasks:
        try:
            with open(f"{task_dir}/{tid}/children", "rb") as handle:
                found.update(int(child) for child in handle.read().split())
        except OSError:  # the thread ended between listing and reading
            continue
    return sorted(child for child in found if not _zombie(child))


def descendants_of(pid: int) -> list[int] | None:
    """Every live descendant of ``pid`` (workers' own children too), or None where /proc cannot say."""
    direct = children_of(pid)
    if direct is None:
        return None
    found: list[int] = []
    stack = list(direct)
    while stack:
        child = stack.pop()
        if child in found or child == pid:
            continue
        found.append(child)
        stack.extend(children_of(child) or ())
    return sorted(found)


def _zombie(pid: int) -> bool:
    """A child that exited and was not reaped yet: no longer anyone's worker."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as handle:
            state = handle.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True  # gone already
    return state == b"Z"
