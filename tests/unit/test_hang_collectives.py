"""The hang rule reads the stuck ranks' numbered collectives (issue #48): who waits in which, who never issued it."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from gputop.diagnose import diagnose
from gputop.diagnose.details import DesyncDetails, HangDetails
from gputop.diagnose.findings import Finding
from gputop.diagnose.rules.collective_positions import Position, read_positions
from gputop.diagnose.rules.desync import desync_findings
from gputop.diagnose.rules.hang import reading_text
from gputop.model.collectives import InCollective
from gputop.model.figures import SPAN_S, summarize
from gputop.protocol import GroupCalls, StackFrame
from tests.support.frames import LOCK, T0, hung_run, stacks, with_stacks

METRIC_SITE = StackFrame("collective", "train.py", 190, "main")
BACKWARD = StackFrame("backward", "train.py", 88, "main")


def in_collective(seq: int, kind: str = "all_reduce", nbytes: int = 4, group: str = "world") -> GroupCalls:
    return GroupCalls(group=group, seq=seq, issued=3, completed=2, kind=kind, bytes=nbytes, inside=True)


def counted(seq: int, group: str = "world") -> GroupCalls:
    return GroupCalls(group=group, seq=seq, issued=3, completed=3, kind="all_reduce", bytes=4)


def hang_of(by_rank: dict[int, tuple[StackFrame, tuple[GroupCalls, ...]]], ranks: int = 2) -> Finding:
    messages = {
        rank: [msgspec.structs.replace(stacks(rank, T0 + 27, now=now), groups=groups)]
        for rank, (now, groups) in by_rank.items()
    }
    figures = summarize(with_stacks(hung_run(ranks=ranks), messages), span_s=SPAN_S)
    (hang,) = [f for f in diagnose(figures) if f.cause == "hang"]
    return hang


def test_a_rank_that_never_issued_the_collective_the_others_wait_in_is_named_with_its_last() -> None:
    hang = hang_of({0: (METRIC_SITE, (in_collective(21),)), 1: (LOCK, (counted(20),))})
    assert "rank 0 waits in all_reduce #21 on world (from `main` (train.py:190)), which rank 1 never issued " \
        "(its last: #20)" in hang.title, hang.title  # fmt: skip
    assert "rank 1 is in `wait_for_lock` (train.py:102)" in hang.title, hang.title
    assert hang.ranks == (1,) and hang.waiting_ranks == (0,)
    assert isinstance(hang.details, HangDetails) and hang.details.collective is not None
    assert hang.details.collective.reading == "never_issued"
    assert "never issued the collective" in hang.suggestion
    by_rank = {f.rank: f for f in hang.frames}  # the detail screen's and the report's line for each rank
    assert by_rank[0].text().endswith("; collectives: in all_reduce #21 on world (4 B)"), by_rank[0].text()
    assert by_rank[1].text().endswith("; collectives: #20 on world"), by_rank[1].text()


def test_every_rank_in_one_collective_none_completed_is_the_exchange_itself() -> None:
    hang = hang_of({0: (METRIC_SITE, (in_collective(21),)), 1: (METRIC_SITE, (in_collective(21),))})
    assert "ranks 0, 1 wait in all_reduce #21 on world (from `main` (train.py:190)): every rank issued it and " \
        "none completed it, so the exchange itself is stuck" in hang.title, hang.title  # fmt: skip
    assert "the network" in hang.suggestion


def test_ranks_in_different_collectives_are_said_to_be() -> None:
    rank_0 = (in_collective(21), counted(4, "tp"))
    rank_1 = (counted(21), in_collective(5, "broadcast", 4, "tp"))
    hang = hang_of({0: (METRIC_SITE, rank_0), 1: (METRIC_SITE, rank_1)})
    assert "rank 1 in broadcast #5 on tp: the ranks are in different collectives" in hang.title, hang.title


def test_ddps_own_all_reduce_is_numbered_by_its_group() -> None:
    """A rank in DDP's backward with no collective of the tap's waits in DDP's all-reduce, numbered by the group."""
    hang = hang_of({0: (BACKWARD, (counted(21),)), 1: (LOCK, (counted(20),))})
    assert "rank 0 waits in DDP's gradient all_reduce #21 on world" in hang.title, hang.title
    assert "which rank 1 never issued (its last: #20)" in hang.title, hang.title


def test_with_no_rank_blocked_in_a_collective_a_count_behind_the_others_names_the_rank() -> None:
    """NCCL returns once a collective is queued and a rank waits at a later sync: the counts alone say who never
    issued the newest collective of a group."""
    hang = hang_of({0: (BACKWARD, (counted(16),)), 1: (LOCK, (counted(15),))})
    assert "rank 0 issued DDP's" not in hang.title  # rank 0 in DDP's backward is in its all-reduce: blocked in it
    hang = hang_of({0: (LOCK, (counted(16),)), 1: (LOCK, (counted(15),))})
    assert "rank 0 issued collective #16 on world, which rank 1 never issued (its last: #15)" in hang.title, hang.title
    assert hang.ranks == (1,)


def test_at_thousands_of_ranks_the_words_stay_short() -> None:
    """4,096 ranks, three of them behind: the waiting ones counted, the three named."""
    behind = {17, 345, 800}
    found = {
        rank: Position(rank, None if rank in behind else InCollective("all_gather", "dp", 88, 1 << 20),
                       (("dp", 87 if rank in behind else 88),), None)
        for rank in range(4096)
    }  # fmt: skip
    reading = read_positions(found, range(4096))
    assert reading is not None and reading.culprits == (17, 345, 800)
    assert reading_text(reading, {}) == "4,093 ranks wait in all_gather #88 on dp, which ranks 17, 345, 800 never " \
        "issued (their last: #87)"  # fmt: skip


# -- desync: one number, different calls ----------------------------------------------------------------------


def findings_of(by_rank: Mapping[int, tuple[StackFrame, tuple[GroupCalls, ...]]]) -> list[Finding]:
    messages = {
        rank: [msgspec.structs.replace(stacks(rank, T0 + 27, now=now), groups=groups)]
        for rank, (now, groups) in by_rank.items()
    }
    return diagnose(summarize(with_stacks(hung_run(), messages), span_s=SPAN_S))


def test_a_size_mismatch_at_one_number_is_a_desync_with_both_call_sites_and_the_hang_its_symptom() -> None:
    other_site = StackFrame("collective", "train.py", 192, "main")
    found = findings_of(
        {0: (METRIC_SITE, (in_collective(21, nbytes=4),)), 1: (other_site, (in_collective(21, nbytes=8),))}
    )
    (desync,) = [f for f in found if f.cause == "desync"]
    assert desync.severity == "critical" and desync.ranks == (0, 1)
    assert desync.title == (
        "collective #21 on world is not the same call on every rank: rank 0 all_reduce of 4 B from `main` "
        "(train.py:190); rank 1 all_reduce of 8 B from `main` (train.py:192)"
    ), desync.title
    assert isinstance(desync.details, DesyncDetails) and desync.details.number == 21
    (hang,) = [f for f in found if f.cause == "hang"]
    assert hang.severity == "info" and "see desync" in hang.title, hang.title


def test_a_rank_in_ddps_all_reduce_where_another_is_in_the_scripts_is_a_desync() -> None:
    """The rank that skipped a rank-conditional all_reduce went on into DDP's: the two meet at one number."""
    found = findings_of({0: (METRIC_SITE, (in_collective(21),)), 1: (BACKWARD, (counted(21),))})
    (desync,) = [f for f in found if f.cause == "desync"]
    assert "rank 0 all_reduce of 4 B from `main` (train.py:190); rank 1 DDP's gradient all_reduce from `main` " \
        "(train.py:88)" in desync.title, desync.title  # fmt: skip
    # Not hung (a job of long steps sends its numbers while it steps): a rank in its backward may not have issued
    # DDP's all-reduce yet, and is not taken to be in it.
    messages = {0: [msgspec.structs.replace(stacks(0, T0 + 27, now=METRIC_SITE), groups=(in_collective(21),))],
                1: [msgspec.structs.replace(stacks(1, T0 + 27, now=BACKWARD), groups=(counted(21),))]}  # fmt: skip
    (run,) = summarize(with_stacks(hung_run(), messages), span_s=SPAN_S).runs
    assert desync_findings(run, hung=False) == [] and len(desync_findings(run, hung=True)) == 1


def test_the_same_call_everywhere_is_no_desync_and_all_to_all_may_differ_in_size() -> None:
    same = findings_of({0: (METRIC_SITE, (in_collective(21),)), 1: (METRIC_SITE, (in_collective(21),))})
    by_rank = {r: (METRIC_SITE, (in_collective(21, "all_to_all", 4 * (r + 1)),)) for r in (0, 1)}
    uneven = findings_of(by_rank)
    assert not [f for f in same + uneven if f.cause == "desync"]
