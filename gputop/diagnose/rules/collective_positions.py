"""Where each stuck rank is among the collectives: which numbered collective it is in, and how far each group's count
has come on it.  Pure: the ranks' newest stack messages in (``RankFrames.groups``, ``GroupCalls`` on the wire).

torch numbers every collective of a process group alike on every rank that issues it, so ranks in collective #N of
one group are in the same exchange, and a rank whose count on that group is below N never issued it.  The hang rule
reads the three cases apart (``read_positions``); the desync rule reads ranks at one number in different calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gputop.model.collectives import HangCollective, InCollective, Reading
from gputop.model.figures import RankFigures
from gputop.model.frames import Frame, RankFrames
from gputop.model.snapshot import DONE, LOST
from gputop.protocol import GroupCalls

# The collective DDP's reducer issues from C++ in the backward pass: the tap never sees it, its group's count does.
DDP_ALL_REDUCE = "DDP's gradient all_reduce"


@dataclass(frozen=True)
class Position:
    """One rank's place among the collectives: the one it is in (None: in none the tap or DDP names), its counts."""

    rank: int
    inside: InCollective | None
    counts: tuple[tuple[str, int], ...]  # (group, torch's count on it) for each group it reported
    frame: Frame | None  # its stack sample now: the call site

    def count(self, group: str) -> int | None:
        return next((n for g, n in self.counts if g == group), None)


def positions(stuck: Iterable[RankFigures], frames: dict[int, RankFrames]) -> dict[int, Position]:
    """The positions of the ranks whose newest stack message numbered their groups."""
    out = {}
    for rank in stuck:
        found = frames.get(rank.rank)
        if found is None or not found.groups:
            continue
        counts = tuple((g.group, g.seq) for g in found.groups if g.seq is not None)
        inside = next((in_collective(g) for g in found.groups if in_collective(g) is not None), None)
        if inside is None and found.now is not None and found.now.where == "backward" and rank.hello.ddp and counts:
            # In DDP's backward with no collective of the tap's: in DDP's all-reduce, on the default group (sent first).
            inside = InCollective(DDP_ALL_REDUCE, counts[0][0], counts[0][1], None)
        out[rank.rank] = Position(rank.rank, inside, counts, found.now)
    return out


def in_collective(group: GroupCalls) -> InCollective | None:
    """The collective the rank is in on ``group``: the newest, blocking, or an earlier one it waits for (a
    functional collective's ``wait_tensor``, a Work's ``wait()``); None where it is in neither."""
    if group.inside and group.seq is not None:
        return InCollective(group.kind, group.group, group.seq, group.bytes)
    if group.waits is not None:
        return InCollective(group.waits_kind, group.group, group.waits, group.waits_bytes)
    return None


def read_positions(found: dict[int, Position], all_ranks: Iterable[int]) -> HangCollective | None:
    """The hang's reading from the positions; None when no rank is in a numbered collective and no group's counts
    differ across the ranks that said them."""
    by_key: dict[tuple[str, int], list[Position]] = {}
    for position in found.values():
        if position.inside is not None:
            by_key.setdefault(position.inside.key, []).append(position)
    if not by_key:
        return behind_on_counts(found, all_ranks)
    # The collective most ranks wait in; of equals, the newest (the others are behind it).
    key = max(by_key, key=lambda k: (len(by_key[k]), k[1]))
    waiting = by_key[key]
    waited = waiting[0].inside
    assert waited is not None
    behind, elsewhere = [], []
    for position in found.values():
        if position.inside is not None and position.inside.key == key:
            continue
        count = position.count(waited.group)
        if count is not None and count < waited.number:
            behind.append((position.rank, count))
        elif position.inside is not None:
            elsewhere.append((position.rank, position.inside))
    unknown = tuple(sorted(set(all_ranks) - set(found)))
    reading: Reading = (
        "never_issued" if behind else "different" if elsewhere else "silent" if unknown else "none_completed"
    )
    return HangCollective(
        reading=reading,
        waited=waited,
        waiting=tuple(sorted(p.rank for p in waiting)),
        never_issued=tuple(sorted(behind)),
        elsewhere=tuple(sorted(elsewhere, key=lambda item: item[0])),
        unknown=unknown,
    )


def behind_on_counts(found: dict[int, Position], all_ranks: Iterable[int]) -> HangCollective | None:
    """No rank blocked in a collective (NCCL's return once queued; the wait is at a later sync): the group on
    which some ranks' counts are behind the others', the newest number the others issued and they never did."""
    groups = sorted({group for position in found.values() for group, _ in position.counts})
    for group in groups:
        counts = {p.rank: n for p in found.values() if (n := p.count(group)) is not None}
        newest = max(counts.values(), default=0)
        behind = sorted((rank, n) for rank, n in counts.items() if n < newest)
        if behind and len(counts) > 1:
            return HangCollective(
                reading="never_issued",
                waited=InCollective("collective", group, newest, None),
                waiting=tuple(sorted(rank for rank, n in counts.items() if n == newest)),
                never_issued=tuple(behind),
                elsewhere=(),
                unknown=tuple(sorted(set(all_ranks) - set(found))),
                blocked_in=False,
            )
    return None


def stopped_from_outside(rank: RankFigures) -> bool:
    """Whether a rank that no longer reports was ended, not finished: lost (no bye: killed, or its connection cut),
    or its bye names a signal or an exception.  A hung job always ends so (the scheduler's SIGTERM, a person's
    Ctrl-C, the NCCL watchdog's abort, a timeout); a rank that exits by itself after a long last stop (a final
    save) finished."""
    return rank.status == LOST or (rank.status == DONE and rank.snapshot.ended_how in ("signal", "exception"))
