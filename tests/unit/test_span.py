"""The dashboard's sliding figures equal ``rank_stats`` over the same span, whatever the windows."""

from __future__ import annotations

import math
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from gputop.model.rank_stats import RankStats, recent
from gputop.model.span import SpanFigures
from gputop.model.sums import rank_stats
from gputop.protocol import Window
from gputop.sketch import sketch_bucket

SPAN_S = 10.0

durations = st.sampled_from([0.0, 0.05, 0.1, 0.11, 0.5, 2.0]) | st.floats(0.0, 30.0)
maybe_duration = st.none() | durations
maybe_count = st.none() | st.integers(0, 2**40)


@st.composite
def window_fields(draw: st.DrawFn) -> dict[str, Any]:
    """One window's measurements: every field a figure reads, often absent, sometimes extreme."""
    steps = draw(st.integers(0, 12))
    step_times = draw(st.lists(durations, min_size=steps, max_size=steps))
    sketch: dict[int, int] = {}
    for d in step_times:
        sketch[sketch_bucket(d)] = sketch.get(sketch_bucket(d), 0) + 1
    ddp = draw(st.booleans())
    return {
        "steps": steps,
        "timed_steps": draw(st.none() | st.integers(0, steps)),
        "step_time_sum_s": sum(step_times),
        "step_time_p50_s": draw(maybe_duration),
        "step_time_p95_s": draw(maybe_duration),
        "step_time_max_s": max(step_times) if bool(step_times) and draw(st.booleans()) else None,
        "step_sketch": sketch,
        "slow_steps": tuple(sorted(((d, draw(durations)) for d in step_times[:3]), reverse=True)),
        "loader_wait_s": draw(durations),
        "loader_batches": draw(st.sampled_from([0, steps])),
        "samples": draw(st.none() | st.integers(0, 512)),
        "forwards": draw(st.none() | st.integers(0, 3 * steps)),
        # DDP: a sampled iteration often lingers over several windows (the same iteration again).
        "comm_s": draw(maybe_duration) if ddp else None,
        "overlap_s": draw(maybe_duration) if ddp else None,
        "forward_s": draw(maybe_duration) if ddp else None,
        "backward_s": draw(maybe_duration) if ddp else None,
        "ddp_iteration": draw(st.none() | st.integers(1, 6)) if ddp else None,
        "ddp_steps": draw(st.none() | st.integers(1, 4)) if ddp else None,
        "gpu_step_time_p50_s": draw(maybe_duration),
        "mem_allocated_bytes": draw(maybe_count),
        "mem_reserved_bytes": draw(maybe_count),
        "mem_peak_bytes": draw(maybe_count),
        "mem_total_bytes": draw(maybe_count),
        "ooms": draw(st.none() | st.integers(0, 3)),
        "rss_bytes": draw(maybe_count),
        "threads": draw(st.none() | st.integers(1, 64)),
        "workers": draw(st.none() | st.integers(0, 8)),
        "cpu_pct": draw(st.none() | st.floats(0.0, 800.0)),
        "workers_cpu_pct": draw(st.none() | st.floats(0.0, 800.0)),
        "main_cpu_wait_s": draw(maybe_duration),
        "cpu_wait_s": draw(maybe_duration),
        "cpu_run_s": draw(maybe_duration),
        "workers_cpu_wait_s": draw(maybe_duration),
        "dropped": draw(st.integers(0, 5)),
        "reporter_cpu_s": draw(st.none() | st.floats(0.0, 0.01)),
        "hook_s": draw(st.none() | st.floats(0.0, 0.01)),
        "sent_bytes": draw(st.none() | st.integers(0, 4096)),
    }


@st.composite
def runs(draw: st.DrawFn) -> list[tuple[Window, bool]]:
    """A rank's windows as they arrive, each with whether the dashboard refreshes after it.

    Windows are usually 0.5 s apart; sometimes a gap (windows lost), a burst,
    a clock stepping back, or the rank starting over (its windows count from 1).
    """
    n = draw(st.integers(1, 45))
    t, seq, total = 1000.0, 0, 0
    arrivals = []
    for _ in range(n):
        fields = draw(window_fields())
        gap = draw(st.sampled_from([0.5] * 12 + [0.0, 0.25, 3.0, 11.0, -2.0]))
        t = max(t + gap, 0.0)
        seq = 0 if draw(st.integers(0, 40)) == 0 else seq  # the rank started over
        seq += 1
        total += fields["steps"]
        window = Window(run_id="r", rank=0, seq=seq, t0=max(t - 0.5, 0.0), t1=t, step_total=total, **fields)
        arrivals.append((window, draw(st.integers(0, 3)) > 0))
    return arrivals


def assert_same(running: RankStats, fresh: RankStats, context: str) -> None:
    for name, a, b in figure_pairs(running, fresh):
        same = a == b or (isinstance(a, float) and math.isnan(a) and isinstance(b, float) and math.isnan(b))
        assert same, f"{name}: sliding {a!r}, rank_stats {b!r} ({context})"


def figure_pairs(a: msgspec.Struct, b: msgspec.Struct, prefix: str = "") -> list[tuple[str, object, object]]:
    """Each figure of two structs side by side, by its dotted name, a group's figures one by one."""
    pairs: list[tuple[str, object, object]] = []
    for field in msgspec.structs.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, msgspec.Struct) and type(x) is type(y) and not isinstance(x, tuple):
            pairs += figure_pairs(x, y, f"{prefix}{field.name}.")
        else:
            pairs.append((f"{prefix}{field.name}", x, y))
    return pairs


@settings(max_examples=50, deadline=None)
@given(runs(), st.sampled_from([40, 240, 8]))
def test_sliding_figures_equal_rank_stats_over_the_span(arrivals: list[tuple[Window, bool]], copied: int) -> None:
    """Whatever arrives, each refresh's figures are rank_stats over ``recent`` of the view's windows."""
    span = SpanFigures(SPAN_S)
    history: list[Window] = []
    for i, (window, refresh) in enumerate(arrivals):
        history.append(window)
        if not refresh:
            continue
        view = tuple(history[-copied:])  # a live view copies each rank's newest windows
        windows, stats = span.figures("r:0", view)
        expected = recent(view, SPAN_S)
        assert [w.seq for w in windows] == [w.seq for w in expected], f"after window {i}"
        assert_same(stats, rank_stats(expected), f"after window {i} of {len(arrivals)}")


def test_a_long_run_never_drifts_from_rank_stats() -> None:
    """Many minutes of windows, stalls entering and leaving: the sliding figures stay rank_stats' to the last bit."""
    span = SpanFigures(SPAN_S)
    history: list[Window] = []
    total = 0
    for seq in range(1, 1500):
        steps = 3 + seq % 4
        total += steps
        step = 0.1 + 0.01 * (seq % 7) + (5.0 if seq % 97 == 0 else 0.0)  # a stall now and then
        history.append(
            Window(
                run_id="r",
                rank=0,
                seq=seq,
                t0=seq * 0.5 - 0.5,
                t1=seq * 0.5,
                steps=steps,
                step_total=total,
                step_time_sum_s=steps * step,
                step_time_max_s=step,
                step_sketch={sketch_bucket(step): steps},
                slow_steps=((step, 0.01),),
                loader_wait_s=0.01 * steps,
                loader_batches=steps,
                comm_s=0.02 + 0.001 * (seq % 3),
                overlap_s=0.01,
                ddp_iteration=seq // 3,  # each sample lingers three windows
                cpu_pct=100.0 + seq % 10,
                mem_peak_bytes=2**30 + (seq % 50) * 2**20,
            )
        )
        view = tuple(history[-40:])
        windows, stats = span.figures("r:0", view)
        expected = recent(view, SPAN_S)
        assert windows == tuple(expected), f"at window {seq}"
        assert_same(stats, rank_stats(expected), f"at window {seq}")


def test_ranks_gone_from_the_view_are_forgotten() -> None:
    span = SpanFigures(SPAN_S)
    w = Window(run_id="r", rank=0, seq=1, t0=0.0, t1=0.5, steps=1, step_total=1, step_time_sum_s=0.1)
    span.figures("r:0", (w,))
    span.figures("r:1", (w,))
    span.keep_only(["r:1"])
    assert list(span._ranks) == ["r:1"]
