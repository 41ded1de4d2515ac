"""Per-rank figures over windows: what "loader wait %" and "steps" mean everywhere."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputop.combine import count_steps
from gputop.model.rank_stats import recent
from gputop.model.statistics import leave_one_out_medians, median
from gputop.model.sums import rank_stats
from gputop.protocol import Window
from gputop.reporter.clock import StepMark
from gputop.reporter.window import step_fields
from gputop.sketch import sketch_bucket


def w(seq: int, steps: int, total: int, **kw: object) -> Window:
    return Window(run_id="r", rank=0, seq=seq, t0=seq * 0.5, t1=(seq + 1) * 0.5, steps=steps, step_total=total, **kw)  # type: ignore[arg-type]


def test_steps_count_survives_a_missing_window() -> None:
    windows = [w(1, 5, 5), w(2, 5, 10), w(4, 5, 20)]  # window 3 (5 steps) was lost
    assert count_steps(windows) == 20
    assert count_steps([w(7, 3, 33)]) == 3  # a history that starts late counts only its own steps
    assert count_steps([]) == 0


def test_loader_wait_share_is_wait_over_wall_step_time() -> None:
    windows = [
        w(1, 10, 10, step_time_sum_s=1.0, loader_wait_s=0.25, loader_batches=10),
        w(2, 10, 20, step_time_sum_s=1.0, loader_wait_s=0.15, loader_batches=10),
    ]
    stats = rank_stats(windows)
    assert abs(stats.phases.loader_wait_frac - 0.2) < 1e-9  # type: ignore[operator]
    assert abs(stats.phases.loader_wait_s - 0.02) < 1e-9  # type: ignore[operator]
    assert abs(stats.step.mean_s - 0.1) < 1e-9  # type: ignore[operator]


def test_untracked_loader_is_not_measured_rather_than_zero() -> None:
    stats = rank_stats([w(1, 10, 10, step_time_sum_s=1.0)])
    assert stats.phases.loader_wait_frac is None and stats.phases.loader_wait_s is None
    assert stats.phases.comm_s is None and stats.phases.exposed_comm_frac is None and stats.memory.peak_bytes is None


def test_exposed_comm_subtracts_overlap() -> None:
    stats = rank_stats([w(1, 10, 10, step_time_sum_s=1.0, comm_s=0.03, overlap_s=0.01)])
    assert abs(stats.phases.exposed_comm_s - 0.02) < 1e-9  # type: ignore[operator]
    assert abs(stats.phases.exposed_comm_frac - 0.2) < 1e-9  # type: ignore[operator]


def test_recent_keeps_the_newest_span() -> None:
    windows = [w(i, 1, i) for i in range(1, 41)]
    assert [x.seq for x in recent(windows, 2.0)] == [37, 38, 39, 40]


def test_a_ddp_sample_repeated_over_many_windows_counts_once() -> None:
    """DDP times every Nth iteration; a sample that lingered 9 windows must not outweigh the next one."""
    lingering = [w(i, 1, i, step_time_sum_s=0.1, comm_s=0.010, ddp_iteration=10) for i in range(1, 10)]
    fresh = [w(10, 1, 10, step_time_sum_s=0.1, comm_s=0.030, ddp_iteration=20)]
    stats = rank_stats(lingering + fresh)
    assert abs(stats.phases.comm_s - 0.020) < 1e-9  # type: ignore[operator]


def test_ddp_windows_weigh_the_iterations_they_average() -> None:
    """A window averaging 3 iterations outweighs one holding a single sampled iteration."""
    windows = [
        w(1, 1, 1, step_time_sum_s=0.1, comm_s=0.5, ddp_iteration=1, ddp_steps=1),  # warm-up
        w(2, 3, 4, step_time_sum_s=0.3, comm_s=0.010, ddp_iteration=4, ddp_steps=3),
        w(3, 1, 5, step_time_sum_s=0.1, comm_s=0.050, ddp_iteration=5, ddp_steps=1),
    ]
    assert rank_stats(windows).phases.comm_s == pytest.approx((3 * 0.010 + 0.050) / 4)


def test_ddps_first_iteration_is_left_out_once_later_ones_are_known() -> None:
    """The first iteration rebuilds DDP's buckets: alone it is all there is, later it is no typical step."""
    warmup = w(1, 2, 2, step_time_sum_s=0.2, forward_s=0.9, comm_s=0.5, ddp_iteration=2, ddp_steps=2)
    assert rank_stats([warmup]).phases.forward_s == pytest.approx(0.9)
    settled = w(2, 2, 4, step_time_sum_s=0.2, forward_s=0.1, comm_s=0.02, ddp_iteration=4, ddp_steps=2)
    assert rank_stats([warmup, settled]).phases.forward_s == pytest.approx(0.1)
    sampled = w(3, 1, 5, step_time_sum_s=0.1, forward_s=0.2, comm_s=0.02, ddp_iteration=5)  # every Nth: kept
    assert rank_stats([warmup, settled, sampled]).phases.forward_s == pytest.approx((2 * 0.1 + 0.2) / 3)


def test_the_first_step_without_a_duration_does_not_dilute_the_mean() -> None:
    """A reporter's first step has no previous mark: it counts as a step but not in the time totals."""
    first = w(1, 5, 5, timed_steps=4, step_time_sum_s=0.4, loader_wait_s=0.04, loader_batches=5)
    stats = rank_stats([first])
    assert stats.steps == 5
    assert abs(stats.step.mean_s - 0.1) < 1e-9  # type: ignore[operator]
    assert abs(stats.phases.loader_wait_s - 0.01) < 1e-9  # type: ignore[operator]


def test_percentiles_from_the_histogram_never_exceed_the_slowest_step() -> None:
    """Merged histograms report bucket middles; a p95 above the max would read as a contradiction."""
    windows = [
        w(i, 2, 2 * i, step_time_sum_s=0.6, step_time_max_s=0.304, step_sketch={sketch_bucket(0.3): 2})
        for i in range(1, 4)
    ]
    stats = rank_stats(windows)
    assert stats.step.max_s == pytest.approx(0.304)
    assert stats.step.p95_s is not None and stats.step.p95_s <= 0.304
    assert stats.step.p50_s is not None and stats.step.p50_s <= stats.step.p95_s


def test_gputop_accounts_for_its_own_cost() -> None:
    """Reporter thread CPU and hook time per window become a rank's share of CPU, per-step and per-core figures."""
    windows = [
        w(1, 10, 10, step_time_sum_s=0.5, cpu_pct=50.0, reporter_cpu_s=0.001, hook_s=0.0005, sent_bytes=800),
        w(2, 10, 20, step_time_sum_s=0.5, cpu_pct=50.0, reporter_cpu_s=0.003, hook_s=0.0005, sent_bytes=1200),
    ]
    stats = rank_stats(windows)
    assert stats.cost.reporter_cpu_pct == pytest.approx(100 * 0.004 / 1.0)  # 0.4% of a core over 1 s
    assert stats.cost.hook_s_per_step == pytest.approx(0.001 / 20)
    assert stats.cost.cpu_frac == pytest.approx(0.005 / 0.5)  # of the 0.5 CPU-s the rank used
    assert stats.cost.sent_bytes_per_s == pytest.approx(2000.0)


def test_a_reporter_that_does_not_account_for_itself_is_na() -> None:
    stats = rank_stats([w(1, 10, 10, step_time_sum_s=0.5, cpu_pct=50.0)])
    assert stats.cost.reporter_cpu_pct is None and stats.cost.hook_s_per_step is None and stats.cost.cpu_frac is None


def exact_quantile(durations: list[float], q: float) -> float:
    ordered = sorted(durations)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


@settings(max_examples=60, deadline=None)
@given(
    shape=st.sampled_from(["lognormal", "bimodal", "steady", "uniform"]),
    steps=st.integers(min_value=20, max_value=600),
    per_window=st.integers(min_value=1, max_value=40),
    seed=st.integers(min_value=0, max_value=2**16),
)
def test_run_quantiles_merged_across_windows_are_within_two_percent_of_exact(
    shape: str, steps: int, per_window: int, seed: int
) -> None:
    """p50/p95 of a run come from windows' sketches, never per-step data: still within 2% of the true steps'."""
    rng = random.Random(seed)
    draw = {
        "lognormal": lambda: rng.lognormvariate(math.log(0.05), 0.6),
        "bimodal": lambda: 0.223 if rng.random() < 0.5 else 0.266,  # the p50 that used to jump between two buckets
        "steady": lambda: rng.gauss(0.1, 0.002),
        "uniform": lambda: rng.uniform(0.001, 2.0),
    }[shape]
    durations = [draw() for _ in range(steps)]
    windows, t, total = [], 0.0, 0
    for seq, start in enumerate(range(0, steps, per_window), start=1):
        chunk = durations[start : start + per_window]
        marks = [StepMark(end_s=t + i, duration_s=d, loader_wait_s=0.0, batches=0) for i, d in enumerate(chunk)]
        fields = step_fields(marks, None)
        total += len(chunk)
        windows.append(Window(run_id="r", rank=0, seq=seq, t0=t, t1=t + 0.5, step_total=total, **fields))
        t += 0.5
    stats = rank_stats(windows)
    for q, got in ((0.5, stats.step.p50_s), (0.95, stats.step.p95_s)):
        want = exact_quantile(durations, q)
        assert got is not None
        assert abs(got - want) / want <= 0.02, f"{shape}: p{q * 100:.0f} {got:.6f}s vs exact {want:.6f}s"


@given(st.lists(st.sampled_from([0.0, 0.1, 0.5, 2.0]) | st.floats(0, 10), max_size=40))
def test_each_value_is_compared_with_the_median_of_the_others(values: list[float]) -> None:
    """The straggler rule's one-sort leave-one-out medians are the medians it used to compute one by one."""
    expected = [median(values[:i] + values[i + 1 :]) for i in range(len(values))]
    assert leave_one_out_medians(values) == expected
