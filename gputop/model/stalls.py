"""Stalls: the steps of a rank that take several times its median, how many, where their time went, how often.

Read from per-step data, never from means: the span's step-time sketch counts
them (every step, 1% accurate), each window's slowest steps say whether their
time was spent waiting for a batch or in the all-reduce, and their step numbers
tell a period ("every 10 steps") from irregular stops, and stops from a new level.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gputop.model.rank_stats import StallFigures
from gputop.model.statistics import median
from gputop.protocol import Window
from gputop.sketch import sketch_value_s

# A stall is a step that takes at least this many times the median step: a
# checkpoint save, an evaluation pass, a GC pause or a slow batch among ordinary
# steps.  Three times, so the tail of a noisy but steady run (p95 ~ 1.5x p50 on
# 2 shared cores) is never one.
STALL_FACTOR = 3.0


def stalls(windows: Sequence[Window], sketch: dict[int, int], p50_s: float, step_sum_s: float) -> StallFigures:
    """Steps of at least STALL_FACTOR x the median: how many, how long, what share of the run, and where.

    Counts and durations come from the merged sketch (every step, 1% accurate);
    where the time went from each window's slowest steps: their loader wait,
    and, around the windows that hold a stall, this rank's exposed comm beyond
    its usual.  A rank that waits in the all-reduce while another stops shows
    the same long steps as the one that stopped, but its stall time is comm:
    that tells them apart.  Around, not in: DDP's logger reports an iteration's
    times at the next iteration's forward, so a reporter tick that falls
    between them (one overdue after gloo let go of the GIL, on a busy machine)
    puts a waiting rank's long exchange in the window before or after the one
    that holds its long step.
    """
    line_s = STALL_FACTOR * p50_s
    count, total_s, excess_s = 0, 0.0, 0.0
    for bucket in sorted(sketch):  # in bucket order: the sums do not depend on the order steps came in
        n = sketch[bucket]
        value = sketch_value_s(bucket)
        if value >= line_s:
            count += n
            total_s += n * value
            excess_s += n * (value - p50_s)
    named_s = named_loader_s = window_excess_s = 0.0
    numbers: set[int] = set()
    since_first: list[Window] = []  # the windows with steps from the first that holds a stall on
    near: set[int] = set()  # indexes of the windows that hold a stall and their neighbours
    for index, w in enumerate(windows):
        stalled = [(d, loader) for d, loader in w.slow_steps if d >= line_s]
        if w.steps and (stalled or since_first):
            since_first.append(w)
        if not stalled:
            continue
        if len(w.slow_step_numbers) == len(w.slow_steps):
            numbers.update(n for (d, _), n in zip(w.slow_steps, w.slow_step_numbers, strict=True) if d >= line_s and n)
        named_s += sum(d for d, _ in stalled)
        named_loader_s += sum(loader for _, loader in stalled)
        window_excess_s += sum(d - p50_s for d, _ in stalled)
        near.update((index - 1, index, index + 1))
    window_comm_s = waits_beyond_usual_s(windows, near)
    period, regular = stall_period(sorted(numbers))
    return StallFigures(
        steps=count,
        mean_s=total_s / count if count else None,
        frac=excess_s / step_sum_s if step_sum_s > 0 else 0.0,
        loader_frac=named_loader_s / named_s if named_s > 0 else None,
        in_comm_frac=None
        if window_comm_s is None or window_excess_s <= 0
        else min(window_comm_s / window_excess_s, 1.0),
        period_steps=period,
        regular=regular,
        level_shift=len(since_first) >= LEVEL_SHIFT_WINDOWS
        and all(w.step_time_p50_s is not None and w.step_time_p50_s >= line_s for w in since_first),
    )


def waits_beyond_usual_s(windows: Sequence[Window], near: set[int]) -> float | None:
    """Seconds the ``near`` windows waited in communication beyond the rank's usual per step (the median over
    the other windows, 0 where there are none); None where none of them says."""
    if not near:  # no stall: the usual rank on every refresh, whose windows need not be read at all
        return None
    waits = [window_waits_s(w) for w in windows]
    usual = median([c / _iterations(w) for i, (w, c) in enumerate(zip(windows, waits, strict=True))
                    if c is not None and i not in near]) or 0.0  # fmt: skip
    beyond = []
    for i in sorted(near):
        wait = waits[i] if 0 <= i < len(windows) else None
        if wait is not None:
            beyond.append(max(wait - usual * _iterations(windows[i]), 0.0))
    return sum(beyond) if beyond else None


def _iterations(w: Window) -> int:
    return w.ddp_steps or w.timed or 1


def window_waits_s(w: Window) -> float | None:
    """Seconds the window's steps waited in communication, at least: DDP's exchange (its logger's mean, per
    step) or the collectives' exposed time, whichever is more, where DDP times the phases; the phases' own
    (which hold the tap's) where hooks time them (FSDP2, DeepSpeed); the collectives' where the window has no
    phases (a window that holds only a long step).  None where nothing says.

    A rank that waits for another in its own all-reduce at a step's end (a loss logged, a barrier) shows it
    only among the collectives: DDP's all-reduce runs in C++, where the tap does not see it, and the window's
    DDP row stands for it only where no Python all-reduce was timed on its group (so the two are never added:
    the larger is a floor of the waits).
    """
    tapped = sum(c.exposed_s or 0.0 for c in w.collectives) if w.collectives else None
    if w.exposed_comm_s is None:
        return tapped
    phases_s = w.exposed_comm_s * _iterations(w)
    return max(phases_s, tapped or 0.0) if w.phases_from == "ddp" else phases_s


# Windows with steps, all slow since the first stall, that make a new level: two, so that one long stop
# alone in the newest window (a checkpoint's step, 1.5 s in a 1-s window) is not one.
LEVEL_SHIFT_WINDOWS = 2


# Stalls whose numbers tell a period: at least this many, and this share of them on its progression.
PERIOD_MIN_STALLS = 3
PERIOD_SHARE = 0.6
PERIOD_FILL = 0.75
PERIOD_MAX_STALLS = 40


def stall_period(numbers: Sequence[int]) -> tuple[int | None, bool | None]:
    """(N, True) when stalls fall every N steps, (None, False) when they do not; (None, None): too few to say.

    Each candidate N (a difference of two stall steps) is judged by its best
    progression: how many stalls lie on it (at least ``PERIOD_SHARE`` of them,
    so a few stray ones, a rank descheduled on a busy machine or DDP's first
    iteration, do not hide a checkpoint every 20 steps) and how full it is
    between its first and last stall (at least ``PERIOD_FILL``, so 10 does not
    pass for 20 by catching noise in the gaps).  The N holding the most stalls
    wins, the longer on a tie.  From 10 steps on, one step late still counts:
    a waiting rank's long step can be the one after the stopping rank's.
    """
    numbers = numbers[-PERIOD_MAX_STALLS:]  # the newest: a long run's period is its recent one
    if len(numbers) < PERIOD_MIN_STALLS:
        return None, None
    needed = max(PERIOD_MIN_STALLS, math.ceil(PERIOD_SHARE * len(numbers)))
    # A period is the gap between a stall and one of the next three (a stray stall in between),
    # give or take the one step a waiting rank's stall can lag.
    gaps = {numbers[i + k] - numbers[i] for k in (1, 2, 3) for i in range(len(numbers) - k)}
    candidates = gaps | {g + d for g in gaps if g >= 10 for d in (-1, 1)}
    best: tuple[int, int] | None = None  # (stalls on it, period)
    for period in (c for c in candidates if c >= 3):
        slack = 1 if period >= 10 else 0
        for start in numbers:
            on = [n for n in numbers if n >= start and (n - start) % period <= slack]
            full = len({(n - start) // period for n in on}) >= PERIOD_FILL * ((on[-1] - start) // period + 1)
            if len(on) >= needed and full and (best is None or (len(on), period) > best):
                best = (len(on), period)
    return (best[1], True) if best is not None else (None, False)
