"""Each process group's collectives on this rank, numbered: what the hang and desync rules match across ranks.

The tap (``collectives.py``) counts, per process group, the collectives the training thread issued through it and
those that completed, with the newest one's kind and size, and notes the one the thread is inside now.  That is
memory work on the training thread (a dict lookup, a few stores, ~0.15 µs).  The number itself is torch's: each
process group counts every collective issued on it (``_get_sequence_number_for_group``), DDP's all-reduce from C++
and barriers included, alike on every rank that issues them, so a rank whose count is behind the others' never
issued their newest one.  The reporter thread reads the counts here, only while the training thread has not
finished a step for a while (``flight_recorder.STUCK_AFTER_S``): a collective the thread is inside now, the newest
it issued on its group, is that group's number then.  An asynchronous one (a Work, a functional collective's
tensor) is waited for later: its number was taken as it was issued (``collective_digests.record``) and kept with
it, and while the thread waits for it its group says that number (``GroupCalls.waits``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

from gputop.protocol import MAX_GROUPS_SENT, GroupCalls
from gputop.reporter.collective_digests import new_log


class GroupCounts:
    """One process group's collectives issued through the tap and completed, and the newest one (training thread)."""

    __slots__ = ("completed", "digests", "group", "issued", "kind", "nbytes", "sequence")

    def __init__(self, group: Any) -> None:
        self.group = group  # the process group object (the default one for None)
        # torch's count of the group's collectives, bound once (a lookup less on each collective); None: none
        self.sequence: Callable[[], int] | None = getattr(group, "_get_sequence_number_for_group", None)
        self.issued = 0
        self.completed = 0  # returned, or waited for where it returned a Work
        self.kind = ""  # the newest issued
        self.nbytes = 0
        self.digests = new_log()  # (torch's number, digest) of each issued, until a window takes them


def default_group() -> Any:
    """The default process group, or None where there is none (yet)."""
    c10d: Any = sys.modules.get("torch.distributed.distributed_c10d")
    try:
        return None if c10d is None or not c10d.is_initialized() else c10d._get_default_group()
    except Exception:
        return None


def process_group(group: Any) -> Any:
    """The process group object a collective's group argument names: ``(DeviceMesh, dim)`` and a 1-D mesh as
    DTensor passes them, a group, its registered name, a list of ranks; None for the default group's ``None``
    where there is none, and where it cannot be resolved."""
    try:
        if group is None:
            return default_group()
        if isinstance(group, tuple) and len(group) == 2 and hasattr(group[0], "get_group"):
            return group[0].get_group(group[1])
        if hasattr(group, "get_group"):  # a 1-D DeviceMesh
            return group.get_group()
        if hasattr(group, "_get_sequence_number_for_group"):
            return group
        c10d: Any = sys.modules.get("torch.distributed.distributed_c10d")
        funcol: Any = sys.modules.get("torch.distributed._functional_collectives")
        name = group if isinstance(group, str) else funcol._resolve_group_name(group)
        return c10d._resolve_process_group(name)
    except Exception:
        return None


def sequence_number(group: Any) -> int | None:
    """torch's count of the collectives issued on ``group`` on this rank; None where it cannot be read."""
    try:
        return int(group._get_sequence_number_for_group())
    except Exception:
        return None


class Counted(Protocol):
    """What of the tap (``collectives.CollectiveTap``) the numbers are read from."""

    numbers: dict[Any, GroupCounts]
    inside: GroupCounts | None
    # The asynchronous collective whose wait the training thread is in (``collectives.Issued``): its kind at 0,
    # bytes at 2, group's counts at 5, number at 6.
    waiting: tuple[Any, ...] | None


def group_calls(tap: Counted, name_of: Callable[[Any], str]) -> tuple[GroupCalls, ...]:
    """Each group's numbers now, the default group's first (DDP's all-reduce runs there unseen by the tap); reporter
    thread.  The tap's dict is read while the training thread may add to it: copied first."""
    seen: list[GroupCounts] = []
    for _ in range(3):  # a group added meanwhile changes the dict's size: read it again
        try:
            seen = list({id(c): c for c in tap.numbers.values()}.values())  # None and the default group share one
            break
        except RuntimeError:
            continue
    default = default_group()
    groups = [g for g in seen if g.group is default] + [g for g in seen if g.group is not default]
    if default is not None and not any(g.group is default for g in seen):
        groups.insert(0, GroupCounts(default))
    return tuple(read_group(counts, tap, name_of) for counts in groups[:MAX_GROUPS_SENT])


def read_group(counts: GroupCounts, tap: Counted, name_of: Callable[[Any], str]) -> GroupCalls:
    """One group's numbers, read so that they hold together: the training thread may finish the collective it is
    in and issue the next between two reads, so the count, the kind and the thread's place are read between two
    reads of torch's number and of the tap's count, and "inside" is said only where neither moved."""
    issued, seq = counts.issued, sequence_number(counts.group)
    # Only a blocking call is noted as inside: a Work waited for may be older than its group's newest, whose
    # number the count is.  The one waited for is said by its own number.
    inside, kind, nbytes, completed = tap.inside is counts, counts.kind, counts.nbytes, counts.completed
    waiting = tap.waiting
    waits = waiting if waiting is not None and waiting[5] is counts and waiting[6] is not None else None
    still = counts.issued == issued and sequence_number(counts.group) == seq and (tap.inside is counts) == inside
    waits = waits if waits is not None and still and tap.waiting is waits else None
    return GroupCalls(
        group=name_of(counts.group)[:64],
        seq=seq,
        issued=issued,
        completed=min(completed, issued),
        kind=kind[:32],
        bytes=nbytes if issued else None,
        inside=inside and still,
        waits=None if waits is None else waits[6],
        waits_kind="" if waits is None else waits[0][:32],
        waits_bytes=None if waits is None else waits[2],
    )
