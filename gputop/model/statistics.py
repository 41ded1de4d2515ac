"""Statistics the figures and the rules share: medians, error bands for a share, a sliding maximum.

Pure arithmetic on numbers; no window or figure knows about them.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections import deque
from collections.abc import Sequence
from typing import Generic, TypeVar

T = TypeVar("T")

# Fewer windows than this give no error estimate worth the name.
MIN_WINDOWS_FOR_ERROR = 3

# Student's t, two-sided 95%, at tabulated degrees of freedom (windows - 1), down to 2.0.
# A band of +- 2 standard errors holds the mean 95% of the time only for many windows:
# from 3 windows the sample's own spread is itself a guess, and the band must be
# t(2) = 4.3 errors wide.  The live dashboard judges a run's first seconds on a
# handful of windows, exactly where a normal band calls a warm-up blip a verdict.
_T95_DF = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 30, 40, 60)
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.179, 2.131, 2.086, 2.042, 2.021, 2.0)


def t95(df: int) -> float:
    """Student's t two-sided 95% quantile: the tabulated one at or below ``df`` (a little wide between rows)."""
    if df < 1:
        raise ValueError("df must be at least 1")
    return _T95[bisect.bisect_right(_T95_DF, df) - 1]


def standard_error(values: Sequence[float]) -> float | None:
    """The standard error of the mean of ``values``, widened for few values; None for too few.

    Sample stdev / sqrt(n), times t95(n - 1) / 2: so that the band of +- 2 of
    these errors, which the rules read, is a 95% interval however few the
    windows (Student's t), not just for many.
    """
    n = len(values)
    if n < MIN_WINDOWS_FOR_ERROR:
        return None
    try:
        mean = sum(values) / n
        deviations = [v - mean for v in values]
        variance = sum(map(operator.mul, deviations, deviations)) / (n - 1)  # twice a generator's speed
    except OverflowError:  # shares of absurd windows (a hostile or broken reporter): no band
        return None
    return (variance / n) ** 0.5 * t95(n - 1) / 2.0 if math.isfinite(variance) else None


def median(values: Sequence[float]) -> float | None:
    """The median, or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def leave_one_out_medians(values: Sequence[float]) -> list[float | None]:
    """For each value, the median of all the others (None where there are no others).

    ``[median(values without i) for i]`` in one sort instead of one per value: at
    1,024 ranks the straggler rule compared every rank with the other 1,023.
    """
    n = len(values)
    if n < 2:
        return [None] * n
    positions = sorted(range(n), key=values.__getitem__)
    ordered = [values[i] for i in positions]
    m = n - 1  # how many the others are
    mid = m // 2

    def other(j: int, removed: int) -> float:
        """The j-th smallest of the others, when the value at sorted position ``removed`` is left out."""
        return ordered[j] if j < removed else ordered[j + 1]

    result: list[float | None] = [None] * n
    for removed, i in enumerate(positions):
        result[i] = other(mid, removed) if m % 2 else (other(mid - 1, removed) + other(mid, removed)) / 2
    return result


class SlidingMax(Generic[T]):
    """The largest value over windows that leave oldest first: a monotonic queue, O(1) amortized."""

    __slots__ = ("_queue",)

    def __init__(self) -> None:
        self._queue: deque[tuple[float, T]] = deque()  # values decreasing, windows oldest first

    def push(self, value: float, w: T) -> None:
        queue = self._queue
        while queue and queue[-1][0] <= value:
            queue.pop()
        queue.append((value, w))

    def pop(self, w: T) -> None:
        """``w``, the oldest window, leaves."""
        if self._queue and self._queue[0][1] is w:
            self._queue.popleft()

    @property
    def value(self) -> float | None:
        return self._queue[0][0] if self._queue else None
