"""Linux process facts from /proc: children, run-queue wait (schedstat), and thread names ps can see.

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
# A stat line is 52 numbers and a name of at most 64 bytes: under 1.3 KiB.
_STAT_MAX_BYTES = 4096


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


def schedstat_s(pid: int) -> dict[int, tuple[float, float]] | None:
    """Each thread of ``pid``: (seconds on a CPU, seconds runnable but waiting for one), since it started.

    From ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds; Linux with
    schedstats, which every distribution kernel has).  The wait is the run-queue
    delay: the thread was ready to run and no CPU was free, the direct measure
    of CPU contention.  None where the file does not exist; an empty dict when
    the process is gone.
    """
    task_dir = f"{_PROC}/{pid}/task"
    try:
        tasks = os.listdir(task_dir)
    except FileNotFoundError:
        return {}
    except OSError:
        return None
    out: dict[int, tuple[float, float]] = {}
    for tid in tasks:
        try:
            with open(f"{task_dir}/{tid}/schedstat", "rb") as handle:
                run_ns, wait_ns = handle.read().split()[:2]
        except FileNotFoundError:
            if not os.path.exists(f"{task_dir}/{tid}"):
                continue  # the thread ended between listing and reading
            return None  # the thread exists but the kernel keeps no schedstat
        except (OSError, ValueError):
            continue
        out[int(tid)] = (int(run_ns) / 1e9, int(wait_ns) / 1e9)
    return out


# Threads of the communication libraries (gloo's and NCCL's own): their CPU is the
# gradient exchange itself, so contention among them is communication's cost.
COMM_THREAD_PREFIXES = ("gloo", "pt_gloo", "pt_nccl", "nccl", "ncclproxy")


def thread_name(pid: int, tid: int) -> str:
    """A thread's OS name (/proc/<pid>/task/<tid>/comm), "" if it is gone."""
    try:
        with open(f"{_PROC}/{pid}/task/{tid}/comm", "rb") as handle:
            return handle.read().strip().decode(errors="replace")
    except OSError:
        return ""


def is_comm_thread(name: str) -> bool:
    return name.lower().startswith(COMM_THREAD_PREFIXES)


class RunQueueWait:
    """A per-thread cumulative time (run-queue wait, CPU) between two reads, robust to threads that come and go.

    A thread first seen now counts its whole wait (it started after the last
    read, or it would have been seen); a thread that ended takes its last
    interval with it (at most one window of one thread).
    """

    def __init__(self) -> None:
        self._last: dict[tuple[int, int], float] = {}
        self._primed = False

    def delta_s(self, threads: dict[tuple[int, int], float]) -> float | None:
        """Seconds waited since the previous call, summed over threads; None on the first call."""
        total = 0.0
        for key, wait_s in threads.items():
            total += wait_s - self._last.get(key, 0.0)
        primed, self._primed, self._last = self._primed, True, threads
        return max(total, 0.0) if primed else None


def cpu_ticks() -> dict[int, tuple[int, str]]:
    """Every process's CPU time so far, in clock ticks, with its command name: one read of each stat file.

    What ``top`` reads, and no more: a few microseconds a process, where psutil
    builds a full object per process.  Read through a bare file descriptor: a
    Python file object (its buffer, its context manager) cost as much as the
    read itself, and the host sampler does this for every process every second.
    """
    out: dict[int, tuple[int, str]] = {}
    try:
        names = os.listdir(_PROC)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"{_PROC}/{name}/stat", os.O_RDONLY)
        except OSError:
            continue  # ended between listing and reading
        try:
            data = os.read(fd, _STAT_MAX_BYTES)
        except OSError:
            continue
        finally:
            os.close(fd)
        head, _, tail = data.rpartition(b")")
        fields = tail.split(None, 13)
        try:
            # After "(comm)": state ppid ... utime is the 12th field, stime the 13th (proc(5) fields 14 and 15).
            out[int(name)] = (int(fields[11]) + int(fields[12]), head.split(b"(", 1)[1].decode(errors="replace"))
        except (IndexError, ValueError):
            continue
    return out


def age_s(pid: int) -> float | None:
    """How long ago a process started (its stat file's start time against the system's uptime); None if gone."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as stat:
            tail = stat.read(_STAT_MAX_BYTES).rpartition(b")")[2]
        with open(f"{_PROC}/uptime", "rb") as uptime:
            up_s = float(uptime.read().split()[0])
        # After "(comm)": starttime is the 20th field (proc(5) field 22), in clock ticks since boot.
        start_ticks = int(tail.split(None, 20)[19])
    except (OSError, IndexError, ValueError):
        return None
    return max(up_s - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)


COMMAND_CHARS = 80  # of a command line: enough to tell `python train.py` from `python -m http.server`


def command_of(pid: int) -> str | None:
    """A process's command line, arguments joined by spaces, cut to COMMAND_CHARS; None if gone or a kernel thread."""
    try:
        with open(f"{_PROC}/{pid}/cmdline", "rb") as handle:
            raw = handle.read(4 * COMMAND_CHARS)
    except OSError:
        return None
    text = raw.replace(b"\0", b" ").decode(errors="replace").strip()
    if not text:
        return None
    return text if len(text) <= COMMAND_CHARS else text[: COMMAND_CHARS - 1] + "…"


def owner_of(pid: int) -> str | None:
    """The user name owning a process (its /proc folder), or the uid as text; None if it is gone."""
    try:
        uid = os.stat(f"{_PROC}/{pid}").st_uid
    except OSError:
        return None
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)
