"""Bus bandwidth per collective, by nccl-tests' formulas: the figure that compares with a link's own speed."""

from __future__ import annotations

import pytest

from gputop.model.collectives import CollectiveFigures, bandwidth, bandwidth_text, collectives_text


@pytest.mark.parametrize(
    ("kind", "sent", "ranks", "algorithm", "bus"),
    [
        # nccl-tests: all_reduce busbw = algbw x 2(n-1)/n, S the tensor
        ("all_reduce", 1e9, 8, 1e9, 1e9 * 2 * 7 / 8),
        # all_gather: S is the whole output, n shards of what one rank sends; busbw = algbw x (n-1)/n
        ("all_gather", 1e9, 8, 8e9, 8e9 * 7 / 8),
        # reduce_scatter and all_to_all: S is the input the rank sends; busbw = algbw x (n-1)/n
        ("reduce_scatter", 8e9, 8, 8e9, 8e9 * 7 / 8),
        ("all_to_all", 8e9, 8, 8e9, 8e9 * 7 / 8),
        # broadcast, reduce, point-to-point: the bus carries S once
        ("broadcast", 1e9, 8, 1e9, 1e9),
        ("send", 1e9, 2, 1e9, 1e9),
    ],
)
def test_each_kind_follows_nccl_tests(kind: str, sent: float, ranks: int, algorithm: float, bus: float) -> None:
    assert bandwidth(kind, sent, 1.0, ranks) == pytest.approx((algorithm, bus))


def test_what_cannot_be_said_is_none_not_zero() -> None:
    assert bandwidth("barrier", 0, 1.0, 8) is None
    assert bandwidth("all_reduce", 1e6, 0.0, 8) is None  # no time
    assert bandwidth("all_reduce", 1e6, 1e-3, None) is None  # the group's size unknown (an older recording)
    assert bandwidth("all_reduce", 1e6, 1e-3, 1) == (1e9, 0.0)  # a group of one moves nothing between ranks


def test_a_spans_figures_give_each_calls_bandwidth_and_the_report_says_it() -> None:
    # 4 all-gathers a step of 1 MB each over 8 ranks, 8 ms in flight a step: 2 ms a call
    gather = CollectiveFigures("all_gather", "dp", 4.0, 4e6, 0.008, 0.002, 8)
    assert gather.bandwidth == pytest.approx((4e9, 3.5e9))
    entry = gather.to_dict()
    assert entry["bus_bytes_per_s"] == 3_500_000_000 and entry["ranks"] == 8
    assert collectives_text([entry]).endswith("8.0 ms (2.0 exposed), 3.5 GB/s bus")
    untimed = CollectiveFigures("all_gather", "dp", 4.0, 4e6, None, None, 8)
    assert untimed.bandwidth is None and "bus" not in collectives_text([untimed.to_dict()])
    assert bandwidth_text(870e6) == "870 MB/s" and bandwidth_text(41.23e9) == "41.2 GB/s"
