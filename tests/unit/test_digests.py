"""A desync the backend goes on through, read from each rank's collective digests (issue #55).

The reporter's side runs on a real one-rank gloo group (tests/integration/test_collective_tap.py has the tap);
here the digests of real calls from two call sites, then the store's book and the desync rule over windows made
to measure, as two ranks would send them.
"""

from __future__ import annotations

import sys

import pytest

from gputop.collect.store import Store
from gputop.diagnose import diagnose
from gputop.model.figures import summarize
from gputop.protocol import DigestSite, GroupDigests, Hello, Window, decode, encode
from gputop.reporter.collective_digests import SITED, SiteDigests, new_log, record, take_digests
from gputop.reporter.collective_numbers import GroupCounts

T0 = 1_000_000.0


def log_metric(sites: SiteDigests, dtype: str, nbytes: int, *, sited: bool = False) -> int:
    digest = sites.sited if sited else sites.shape
    return digest(sys._getframe(0), "all_reduce", dtype, nbytes)  # one call site


def log_count(sites: SiteDigests, dtype: str, nbytes: int, *, sited: bool = False) -> int:
    digest = sites.sited if sited else sites.shape
    return digest(sys._getframe(0), "all_reduce", dtype, nbytes)  # another


def test_a_calls_digest_follows_its_dtype_and_size_and_at_a_sited_number_its_place() -> None:
    sites = SiteDigests()
    (digest,) = {log_metric(sites, "float32", 16) for _ in range(3)}
    assert len({digest, log_metric(sites, "int32", 16), log_metric(sites, "float32", 32)}) == 3
    assert log_count(sites, "float32", 16) == digest  # the shape alone: the same from anywhere
    sited = log_metric(sites, "float32", 16, sited=True)
    assert len({digest, sited, log_count(sites, "float32", 16, sited=True)}) == 3
    assert {(c.dtype, c.bytes, c.site.split(" (")[0]) for c in sites.new} >= {
        ("float32", 16, "`log_metric`"), ("int32", 16, "`log_metric`"), ("float32", 16, "`log_count`")}  # fmt: skip
    # Another rank is another process with another table: the same call there has the same digests.
    assert log_metric(SiteDigests(), "float32", 16) == digest
    assert log_metric(SiteDigests(), "float32", 16, sited=True) == sited


class Group:
    """A process group as the log reads it: torch's count of its collectives."""

    def __init__(self) -> None:
        self.count = 0

    def _get_sequence_number_for_group(self) -> int:
        return self.count


def test_every_sited_number_of_a_group_carries_the_call_site_on_every_rank() -> None:
    group = Group()
    counts, sites, shapes = GroupCounts(group), SiteDigests(), {}  # type: ignore[var-annotated]
    for _ in range(2 * SITED):
        record(counts, sites, shapes, "all_reduce", "float32", 16, 1)
        group.count += 1  # the collective ran
    logged = dict(counts.digests)
    assert sorted(logged) == list(range(1, 2 * SITED + 1))  # torch's numbers: the count before, and one
    plain = {digest for number, digest in logged.items() if number % SITED}
    assert len(plain) == 1 and logged[SITED] not in plain and logged[SITED] == logged[2 * SITED]


def test_the_digests_taken_are_those_since_the_last_window_and_survive_the_wire() -> None:
    log = new_log()
    log.extend([(5, 1005), (6, 1006), (9, 1009)])  # 7 and 8: DDP's all-reduces, from C++
    sent = take_digests(log, "world")
    assert sent is not None and (sent.group, sent.digests()) == ("world", [(5, 1005), (6, 1006), (9, 1009)])
    window = Window(run_id="job", rank=0, seq=1, t0=T0, t1=T0 + 1, digests=(sent,))
    assert decode(encode(window)) == window
    assert take_digests(log, "world") is None


def two_ranks(digests: dict[int, list[int]], calls: dict[int, list[DigestSite]]) -> list:  # type: ignore[type-arg]
    store = Store()
    for rank in (0, 1):
        store.ingest(Hello(run_id="job", rank=rank, world_size=2, pid=100 + rank), T0)
        values = b"".join(d.to_bytes(2, "big") for d in digests[rank])
        numbers = tuple(range(1, len(digests[rank]) + 1))
        store.ingest(Window(run_id="job", rank=rank, seq=1, t0=T0, t1=T0 + 1, steps=10, step_total=10,
                            digests=(GroupDigests("world", numbers, values),), digest_sites=tuple(calls[rank])),
                     T0 + 1)  # fmt: skip
    return [f for f in diagnose(summarize(store.snapshot(T0 + 1))) if f.cause == "desync"]


FLOAT = DigestSite("all_reduce", "float32", 4, "`log_metric` (train.py:71)", 1)
INT = DigestSite("all_reduce", "int32", 4, "`log_metric` (train.py:71)", 2)
ELSEWHERE = DigestSite("all_reduce", "float32", 4, "`log_count` (train.py:90)", 3)


def test_ranks_that_all_reduce_float32_and_int32_of_one_size_are_a_critical_desync_naming_both() -> None:
    (desync,) = two_ranks({0: [1, 1, 1, 1], 1: [1, 1, 2, 2]}, {0: [FLOAT], 1: [FLOAT, INT]})
    assert desync.severity == "critical" and desync.ranks == (0, 1)
    assert desync.title == (
        "collective #3 on world is not the same call on every rank: rank 0 all_reduce of 4 B float32 from "
        "`log_metric` (train.py:71); rank 1 all_reduce of 4 B int32 from `log_metric` (train.py:71) (1 later one "
        "differs too)"
    )


def test_the_same_call_from_another_place_is_said_as_such_at_a_lower_severity() -> None:
    (desync,) = two_ranks({0: [1, 1], 1: [1, 3]}, {0: [FLOAT], 1: [FLOAT, ELSEWHERE]})
    assert desync.severity == "warn"
    assert "is the same all_reduce of 4 B float32 on every rank, issued from different places" in desync.title


def test_ranks_whose_digests_agree_have_no_desync() -> None:
    assert two_ranks({0: [1, 2, 1, 2], 1: [1, 2, 1, 2]}, {0: [FLOAT, INT], 1: [FLOAT, INT]}) == []


@pytest.mark.parametrize("late", [0, 1])
def test_a_rank_whose_windows_come_later_is_still_compared(late: int) -> None:
    """The book compares a number whenever its second rank's digest arrives, whichever rank that is."""
    assert len(two_ranks({late: [1, 2], 1 - late: [1, 1]}, {0: [FLOAT, INT], 1: [FLOAT, INT]})) == 1


def test_windows_merged_in_a_recording_keep_their_digests() -> None:
    from gputop.combine import merge_windows

    def window(seq: int, numbers: tuple[int, ...], digests: list[int]) -> Window:
        values = b"".join(d.to_bytes(2, "big") for d in digests)
        sites = (FLOAT,) if seq == 1 else ()
        return Window(run_id="job", rank=0, seq=seq, t0=T0 + seq, t1=T0 + seq + 1,
                      digests=(GroupDigests("world", numbers, values),), digest_sites=sites)  # fmt: skip

    merged = merge_windows([window(1, (1, 2), [1, 1]), window(2, (5,), [2]), window(3, (6, 9), [1, 2])])
    ((world),) = merged.digests
    assert (world.digests(), merged.digest_sites) == ([(1, 1), (2, 1), (5, 2), (6, 1), (9, 2)], (FLOAT,))


def test_calls_that_differ_across_ranks_by_design_are_not_told_apart() -> None:
    """A send meets a recv, and an all_to_all's or a gather's sizes may differ per rank: no desync in them."""
    digests = []
    for kind, nbytes in (("send", 16), ("recv", 16), ("all_to_all", 16), ("all_to_all", 64)):
        counts = GroupCounts(Group())
        record(counts, SiteDigests(), {}, kind, "float32", nbytes, 1)
        digests.append(list(counts.digests))
    assert digests[0] == digests[1] == [] and digests[2] == digests[3] != []
