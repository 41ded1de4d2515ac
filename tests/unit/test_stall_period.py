"""A stall's period from the numbers of the steps that stalled, not from the run's length over their count."""

from __future__ import annotations

import random

import pytest

from gputop.model.stalls import stall_period
from gputop.model.sums import rank_stats
from gputop.protocol import Window
from gputop.reporter.clock import StepMark
from gputop.reporter.window import step_fields
from gputop.sketch import sketch_bucket


def stall_in_comm(windows: list[Window]) -> float:
    frac = rank_stats(windows).stalls.in_comm_frac
    assert frac is not None
    return frac


def test_every_tenth_step() -> None:
    assert stall_period([10, 20, 30, 40, 50]) == (10, True)


def test_a_waiting_ranks_long_step_is_one_later_and_still_on_the_period() -> None:
    assert stall_period([10, 21, 30, 41, 50]) == (10, True)
    assert stall_period([11, 21, 31, 41]) == (10, True)


def test_a_few_stray_stalls_do_not_hide_the_period() -> None:
    """A rank descheduled on a busy machine stalls too: 3 strays among 5 checkpoints every 20 steps."""
    assert stall_period([20, 33, 40, 60, 71, 80, 97, 100]) == (20, True)


def test_stalls_a_window_did_not_keep_leave_gaps_of_whole_periods() -> None:
    assert stall_period([10, 20, 40, 50, 60, 80]) == (10, True)


def test_irregular_stalls_have_no_period() -> None:
    assert stall_period(sorted(random.Random(7).sample(range(8, 400), 25))) == (None, False)


def test_too_few_stalls_say_nothing() -> None:
    assert stall_period([10, 20]) == (None, None)


def window(seq: int, durations: list[float], first_step: int) -> Window:
    marks = [StepMark(end_s=0.0, duration_s=d, loader_wait_s=0.0, batches=1) for d in durations]
    fields = step_fields(marks, None, first_step=first_step)
    return Window(run_id="r", rank=0, seq=seq, t0=seq * 0.5, t1=seq * 0.5 + 0.5, step_total=first_step + len(marks) - 1,
                  **fields)  # fmt: skip


def test_the_reporter_numbers_its_slow_steps_and_the_figures_read_the_period() -> None:
    """Steps of 20 ms, every 12th a 600-ms save: the windows carry the numbers, the stats say every 12 steps."""
    windows, step = [], 1
    for seq in range(12):
        durations = [0.6 if (step + i) % 12 == 0 else 0.02 for i in range(10)]
        windows.append(window(seq, durations, step))
        step += 10
    assert windows[1].slow_step_numbers[0] == 12  # the window of steps 11-20 holds step 12's save
    assert sketch_bucket(0.6) in windows[1].step_sketch
    stats = rank_stats(windows)
    assert (stats.stalls.period_steps, stats.stalls.regular) == (12, True)


def test_steps_that_turn_slow_and_stay_so_are_a_new_level_not_stalls() -> None:
    """A loader gone cold: 20-ms steps for 8 windows, then every step 300 ms (3 a window). Live, the span's
    median is still the fast steps', so each slow step is past the stall line; they are not stops now and then."""
    windows = [window(seq, [0.02] * 20, 1 + 20 * seq) for seq in range(8)]
    windows += [window(8 + k, [0.3] * 3, 161 + 3 * k) for k in range(3)]
    shifted = rank_stats(windows)
    assert shifted.stalls.steps == 9 and shifted.stalls.level_shift is True
    # The same slow steps as stops among ordinary ones, one a window: stalls.
    stops = [window(seq, [0.02] * 19 + ([0.3] if seq >= 8 else [0.02]), 1 + 20 * seq) for seq in range(11)]
    assert rank_stats(stops).stalls.steps == 3 and rank_stats(stops).stalls.level_shift is False
    # One long stop alone in the newest window (a checkpoint's step): too soon to call a new level.
    newest = [window(seq, [0.02] * 20, 1 + 20 * seq) for seq in range(8)] + [window(8, [0.9], 161)]
    assert rank_stats(newest).stalls.level_shift is False


def test_a_rank_that_waits_in_its_own_all_reduce_through_anothers_stop_waited_it_did_not_stop() -> None:
    """Rank 1 of the checkpoint-every-10 job waits 1.5 s in the all-reduce its loop ends with (a loss logged, a
    deadline agreed) while rank 0 saves.  DDP's logger times none of it (its own all-reduce runs in C++); the tap
    does, among the window's collectives, with or without DDP's figures beside it (issue #35's neighbour run)."""
    from msgspec.structs import replace

    from gputop.model.stalls import window_waits_s
    from gputop.protocol import CollectiveTimes

    waited = (CollectiveTimes("all_reduce", "world", 2, 64, 1.5, 1.5),)
    plain = [window(seq, [0.1] * 4 + ([1.6] if seq % 3 == 2 else [0.1]), 1 + 5 * seq) for seq in range(9)]
    assert rank_stats(plain).stalls.in_comm_frac is None  # nothing says where its stalls went: read as its own
    only_tapped = [replace(w, collectives=waited) if w.slow_steps[0][0] > 1 else w for w in plain]
    assert rank_stats(only_tapped).stalls.in_comm_frac == pytest.approx(1.0, abs=0.01)
    with_ddp = [
        replace(w, comm_s=0.01, ddp_steps=5, phases_from="ddp", collectives=waited if w.slow_steps[0][0] > 1
                else ())
        for w in plain
    ]  # fmt: skip
    assert stall_in_comm(with_ddp) > 0.9  # beyond its usual 10 ms a step of DDP's exchange
    # DDP's logger reports an iteration at the next forward: under a neighbour the 1.6-s exchange came in the
    # window before the long step, which had no DDP figures at all (issue #35's neighbour run, rank 1).
    lagged = [replace(w, comm_s=0.01, ddp_steps=5, phases_from="ddp") if w.slow_steps[0][0] < 1 else w for w in plain]
    lagged = [replace(w, comm_s=1.5) if i in (1, 4, 7) else w for i, w in enumerate(lagged)]
    assert stall_in_comm(lagged) > 0.9
    # The rank that stopped: its exchange as usual around its stops.
    stopper = [replace(w, comm_s=0.01, ddp_steps=5, phases_from="ddp") for w in plain]
    assert stall_in_comm(stopper) < 0.05
    # Where hooks time the phases (FSDP2), the exposed time already holds the tap's: never counted twice.
    hooked = replace(with_ddp[2], phases_from="hooks", comm_s=0.3)
    assert window_waits_s(hooked) == 0.3 * 5
    assert window_waits_s(with_ddp[2]) == 1.5 and window_waits_s(with_ddp[0]) == 0.01 * 5
