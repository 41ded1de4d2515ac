"""A run's steps, step time and samples summed per second of window end: the run chart's history.

Kept by the store (``gputop.collect.store``), one per run, as windows arrive.
"""

from __future__ import annotations

import itertools
import math
from collections import deque

from gputop.model.snapshot import CHART_SECONDS, RunHistory
from gputop.protocol import Window

# A second joins the run's history once its windows are in: they are a second long
# or less and arrive within moments of their end.  Shown sooner, the newest second
# would show part of its windows, then all of them: the chart would change twice,
# and a scrolling chart repaints every line when it changes.
RUN_SECOND_SETTLE_S = 1.0


class RunSeconds:
    """One run's steps, step time and samples summed per second of window end, for the run chart.

    Bounded: a few numbers a second whatever the rank count, the chart's
    CHART_SECONDS of them, updated as windows arrive, so the chart never walks
    the windows.  Each second's mean and throughput are worked out when a
    window adds to it, not on every snapshot: a snapshot copies out the newest seconds,
    and the values in it are the same objects as in the snapshot before.
    """

    def __init__(self) -> None:
        self.first_s = 0  # the second of row 0
        # Per second: [timed steps, step time sum, samples, windows with samples].
        kept = CHART_SECONDS + 1 + math.ceil(RUN_SECOND_SETTLE_S)  # and the seconds still filling or settling
        self.rows: deque[list[float]] = deque(maxlen=kept)
        self.step_s: deque[float | None] = deque(maxlen=kept)  # per second: mean step time
        self.samples: deque[float | None] = deque(maxlen=kept)  # per second: samples

    def add(self, w: Window) -> None:
        second = int(w.t1)
        newest_s = self.first_s + len(self.rows) - 1
        kept = self.rows.maxlen or 0
        if not self.rows or second - newest_s >= kept:
            for column in (self.rows, self.step_s, self.samples):
                column.clear()
            self._append_seconds(1)
            self.first_s = second
        elif second > newest_s:
            self._append_seconds(second - newest_s)  # the deques drop the oldest seconds
            self.first_s = second - len(self.rows) + 1
        index = second - self.first_s
        if index < 0:
            return  # older than the history kept
        row = self.rows[index]
        row[0] += w.timed
        row[1] += w.step_time_sum_s
        if w.samples is not None:
            row[2] += w.samples
            row[3] += 1
        self.step_s[index] = row[1] / row[0] if row[0] else None
        self.samples[index] = row[2] if row[3] else None

    def _append_seconds(self, n: int) -> None:
        for _ in range(n):
            self.rows.append([0.0, 0.0, 0.0, 0.0])
            self.step_s.append(None)
            self.samples.append(None)

    def chart(self, until_t: float) -> RunHistory:
        """The newest CHART_SECONDS whole seconds before ``until_t`` (the current second is still filling)."""
        whole = min(max(int(until_t) - self.first_s, 0), len(self.rows))
        start = max(whole - CHART_SECONDS, 0)
        return RunHistory(
            first_s=float(self.first_s + start),
            step_time_s=tuple(itertools.islice(self.step_s, start, whole)),
            samples_per_s=tuple(itertools.islice(self.samples, start, whole)),
        )
