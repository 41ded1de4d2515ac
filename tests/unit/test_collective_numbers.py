"""A rank's numbers per process group, read on the reporter thread while the training thread may move on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gputop.reporter.collective_numbers import GroupCounts, read_group


class Group:
    """A process group whose count moves on by one at each read from ``moves_at`` on (the training thread issued
    the next collective between two reads)."""

    def __init__(self, seq: int, moves_at: int | None = None) -> None:
        self.seq, self.reads, self.moves_at = seq, 0, moves_at

    def _get_sequence_number_for_group(self) -> int:
        self.reads += 1
        if self.moves_at is not None and self.reads >= self.moves_at:
            self.seq += 1
        return self.seq


@dataclass
class Tap:
    numbers: dict[Any, GroupCounts] = field(default_factory=dict)
    inside: GroupCounts | None = None
    waiting: tuple[Any, ...] | None = None  # collectives.Issued


def blocked_in_all_reduce(group: Group) -> Tap:
    counts = GroupCounts(group)
    counts.issued, counts.completed, counts.kind, counts.nbytes = 7, 6, "all_reduce", 4
    return Tap({group: counts}, counts)


def test_a_rank_blocked_in_its_groups_newest_collective_is_in_number_seq() -> None:
    tap = blocked_in_all_reduce(Group(21))
    said = read_group(tap.numbers[next(iter(tap.numbers))], tap, lambda group: "world")
    assert (said.group, said.seq, said.issued, said.completed, said.kind, said.bytes, said.inside) == (
        "world", 21, 7, 6, "all_reduce", 4, True
    )  # fmt: skip


def test_a_count_that_moved_between_two_reads_is_not_said_to_be_the_one_the_rank_is_in() -> None:
    """The kind read may be the next collective's, the number the last one's: a desync read from nothing."""
    tap = blocked_in_all_reduce(Group(21, moves_at=2))
    said = read_group(tap.numbers[next(iter(tap.numbers))], tap, lambda group: "world")
    assert said.seq == 21 and not said.inside


def test_a_rank_waiting_for_an_earlier_asynchronous_collective_says_that_ones_number() -> None:
    """DTensor's all-gather #89 on tp, then a newer #90 issued; the thread waits in #89's wait_tensor."""
    group = Group(90)
    counts, other = GroupCounts(group), GroupCounts(Group(12))
    counts.issued, counts.completed, counts.kind, counts.nbytes = 9, 7, "all_reduce", 4
    tap = Tap({group: counts}, None, ("all_gather", (None, 0), 8192, 0.0, 0.0, counts, 89))
    said = read_group(counts, tap, lambda group: "tp")
    assert (said.seq, said.inside, said.waits, said.waits_kind, said.waits_bytes) == (90, False, 89, "all_gather", 8192)
    # The wait is on another group: this one says only its count.
    assert read_group(other, tap, lambda group: "dp").waits is None


def test_a_wait_that_ended_between_two_reads_is_not_said() -> None:
    group = Group(90, moves_at=2)  # the thread returned from the wait and issued the next collective
    counts = GroupCounts(group)
    counts.issued = 9
    tap = Tap({group: counts}, None, ("all_gather", None, 8192, 0.0, 0.0, counts, 89))
    assert read_group(counts, tap, lambda group: "tp").waits is None
