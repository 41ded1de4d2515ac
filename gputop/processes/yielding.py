"""The dashboard yields the CPU to the job it watches.

On a workstation the dashboard often shares the ranks' cores.  It needs little
CPU on average (a few % of a core), but it needs it in bursts, a refresh at a
time, and a burst that preempts one rank holds every other rank in the next
all-reduce: measured side by side, the live dashboard cost ×1.105 per step while
using 1.6% of a core (docs/performance.md).  At a lower priority the scheduler
gives a waking rank the core at once and the dashboard the gaps between.

Two levels, because Linux has two: ``nice`` orders threads within a scheduling
group, and with autogroup scheduling on (the default on desktop kernels) every
terminal session is a group of its own, weighed against the others by the
group's nice value (``/proc/self/autogroup``, sched(7)).  The dashboard usually
runs in a terminal of its own, so it lowers its session's group too, unless
that session also holds other processes (``torchrun ... & gputop`` in one
shell): those would be lowered with it.

``GPUTOP_NICE=0`` turns it off; another value sets how far (1-19, default 10).
"""

from __future__ import annotations

import os
from pathlib import Path

from gputop import settings

AUTOGROUP_ENABLED = Path("/proc/sys/kernel/sched_autogroup_enabled")


def yield_to_training(environ: dict[str, str] | None = None) -> list[str]:
    """Lower this process's CPU priority (call before starting threads: they inherit it); say what was done."""
    nice = settings.NICE.value(os.environ if environ is None else environ)
    if nice == 0:
        return []
    done = []
    try:
        # Relative to the current value, as the nice command is; Linux applies it to this thread,
        # and threads started from now on inherit it.
        os.nice(max(nice - os.nice(0), 0))
        done.append(f"nice {os.nice(0)}")
    except OSError:
        pass
    if _autogroup_on() and _session_is_ours():
        try:
            Path("/proc/self/autogroup").write_text(str(nice), encoding="ascii")
            done.append(f"session group nice {nice}")
        except OSError:  # an old kernel, or not allowed: nice alone still orders threads in the group
            pass
    return done


def _autogroup_on() -> bool:
    try:
        return AUTOGROUP_ENABLED.read_text(encoding="ascii").strip() == "1"
    except OSError:
        return False


def _session_is_ours() -> bool:
    """Whether this session holds only this process and its ancestors (the shell that started it)."""
    sid = os.getsid(0)
    ancestors = set()
    pid = os.getpid()
    while pid > 1:
        ancestors.add(pid)
        pid = _parent(pid)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in ancestors:
            continue
        try:
            if os.getsid(int(entry.name)) == sid:
                return False
        except OSError:  # gone meanwhile, or not ours to ask
            continue
    return True


def _parent(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0
