"""The store's memory is bounded across ranks, and the run's per-second history adds up its ranks' windows."""

from __future__ import annotations

import msgspec
import pytest

from gputop.collect.store import WINDOW_BUDGET, Store
from gputop.model.snapshot import CHART_SECONDS
from gputop.model.sums import rank_stats
from gputop.protocol import Window, decode, encode
from tests.support import tui_fixtures as fx


def test_many_ranks_share_the_window_budget() -> None:
    store = Store()
    ranks = 2048
    for rank in range(ranks):
        store.ingest(fx.hello("run-big", rank, ranks, hostname=f"node-{rank // 8}"), fx.T0)
    for seq in range(200):  # 100 s: past every rank's share of the budget
        now = fx.T0 + (seq + 1) * fx.WINDOW_S
        store.ingest_many((fx.window("run-big", r, seq, step_s=0.1, loader_s=0.01) for r in range(0, ranks, 64)), now)
    kept = store.snapshot(fx.T0 + 100, history=None)
    per_rank = {len(v.windows) for v in kept.all_ranks() if v.windows}
    assert per_rank == {WINDOW_BUDGET // ranks}, per_rank  # 73 windows (36 s) each, not 200


def test_a_few_ranks_keep_ten_minutes() -> None:
    store = Store()
    store.ingest(fx.hello("run-a", 0, 1), fx.T0)
    for seq in range(1300):
        store.ingest(fx.window("run-a", 0, seq, step_s=0.1, loader_s=0.01), fx.T0 + (seq + 1) * fx.WINDOW_S)
    (rank,) = store.snapshot(fx.T0 + 650, history=None).all_ranks()
    assert len(rank.windows) == 1200


def test_a_ranks_older_windows_read_back_as_received() -> None:
    """All but the newest 40 windows are kept encoded: the whole history and its figures are those received."""
    store = Store()
    store.ingest(fx.hello("run-a", 0, 1), fx.T0)
    received = []
    for seq in range(300):
        message = decode(encode(fx.window("run-a", 0, seq, step_s=0.1 + 0.002 * (seq % 7), loader_s=0.01)))
        assert isinstance(message, Window)
        received.append(message)
        store.ingest(message, message.t1)
    (rank,) = store.snapshot(fx.T0 + 150, history=None).all_ranks()
    assert rank.windows == tuple(received)
    assert rank_stats(rank.windows) == rank_stats(received)


def test_run_history_sums_every_ranks_windows_per_second() -> None:
    snapshot = fx.two_ranks(n_windows=40)  # two ranks, 20 s, a window each every 0.5 s
    (run,) = snapshot.runs
    history = run.history
    # Whole seconds that ended a second before the snapshot's time (T0 + 20 s): the current one
    # is still filling, and the last one's final window may still be on its way.
    assert history.first_s == fx.T0 and len(history.step_time_s) == 19
    # 10 steps of batch 64 a window; the first second holds one window per rank, the others two.
    assert history.samples_per_s == (2 * 640, *[2 * 2 * 640] * 18)
    windows = [w for rank in run.ranks for w in rank.windows if int(w.t1) == int(history.first_s) + 5]
    mean_step = sum(w.step_time_sum_s for w in windows) / sum(w.timed for w in windows)
    assert history.step_time_s[5] == pytest.approx(mean_step)


def test_run_history_holds_the_charts_seconds_however_long_the_run() -> None:
    """An hour-long run's view is the chart's newest seconds, and a window that arrives late still counts."""
    store = Store()
    store.ingest(fx.hello("run-a", 0, 1), fx.T0)
    seconds = CHART_SECONDS + 900
    for seq in range(2 * seconds):
        store.ingest(fx.window("run-a", 0, seq, step_s=0.1, loader_s=0.01), fx.T0 + (seq + 1) * fx.WINDOW_S)
    now = fx.T0 + seconds + 0.2
    history = store.snapshot(now).runs[0].history
    assert len(history.step_time_s) == len(history.samples_per_s) == CHART_SECONDS
    assert history.first_s == fx.T0 + seconds - 1 - CHART_SECONDS  # up to the last whole second settled
    assert history.samples_per_s[-1] == 2 * 5 * 64  # two windows of five steps of 64 samples
    late = fx.window("run-a", 0, 10_000, step_s=0.3, loader_s=0.01)
    late = msgspec.structs.replace(late, t0=now - 30.5, t1=now - 30.0)  # 30 s late, on a second the chart shows
    store.ingest(late, now)
    after = store.snapshot(now).runs[0].history
    index = int(late.t1 - after.first_s)
    before = history.samples_per_s[index]
    assert before is not None and after.samples_per_s[index] == before + 64
    timed = 10  # the second's own two windows of five steps
    step_s = history.step_time_s[index]
    assert step_s is not None
    assert after.step_time_s[index] == pytest.approx((timed * step_s + late.step_time_sum_s) / (timed + late.timed))
