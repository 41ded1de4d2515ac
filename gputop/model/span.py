"""Each rank's figures over the live span, kept up to date as windows arrive and age out.

A live refresh used to run ``rank_stats`` over every rank's 20 windows in the
span, though only one window per rank had arrived and one had left since the
refresh before: at 64 ranks that was most of the dashboard's figures time, and
at 1,024 ranks the reason figures could not follow every refresh.
``SpanFigures`` keeps a ``SpanSums`` per rank and slides it: the windows that
arrived enter, the ones older than the span leave, and the figures are read off
the sums.  The same sums ``rank_stats`` builds, so there is one definition of
each figure; tests/unit/test_span.py checks the two agree on any run of windows.

Not thread-safe: each caller (the dashboard's figures thread, the exporter under its
lock, ``record --alert-command``) keeps its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from gputop.model.rank_stats import RankStats, recent
from gputop.model.sums import SpanSums, rank_stats
from gputop.protocol import Window


class _RankSpan:
    """One rank's windows in the span, oldest first, and their sums."""

    __slots__ = ("_stats", "slides", "sums", "windows")

    def __init__(self) -> None:
        self.windows: deque[Window] = deque()
        self.sums = SpanSums()
        self.slides = True  # False: the next refresh sums the span afresh
        self._stats: tuple[tuple[Window, ...], RankStats] | None = None  # the figures, until the span changes

    def rebuild(self, windows: Sequence[Window]) -> None:
        self.windows = deque(windows)
        self.sums = SpanSums.of(windows)
        self._stats = None

    def enter(self, w: Window) -> None:
        self.windows.append(w)
        self.sums.add(w)
        self._stats = None

    def leave_oldest(self) -> None:
        self.sums.remove(self.windows.popleft())
        self._stats = None

    def figures(self) -> tuple[tuple[Window, ...], RankStats]:
        if self._stats is None:
            windows = tuple(self.windows)
            self._stats = (windows, self.sums.stats(windows))
        return self._stats


def _is_same(a: Window, b: Window) -> bool:
    return a is b or (a.seq == b.seq and a.t1 == b.t1)


def _position(windows: Sequence[Window], w: Window) -> int | None:
    """Where ``w`` is among ``windows``, newest first: the same object, else one with its seq and end.

    The object first: a rank that starts over at once sends a window with the seq and
    the end of the one before (seq 1 twice), and matching that one would take the
    new window for the old and leave it out of the span.  Windows decoded afresh
    (a replay) are never the same objects; for them seq and end tell.
    """
    for i in range(len(windows) - 1, -1, -1):
        if windows[i] is w:
            return i
    for i in range(len(windows) - 1, -1, -1):
        if _is_same(windows[i], w):
            return i
    return None


def _in_time_order(windows: Iterable[Window]) -> bool:
    previous = float("-inf")
    for w in windows:
        if w.t1 < previous:
            return False
        previous = w.t1
    return True


class SpanFigures:
    """Every rank's figures over the newest ``span_s`` seconds of its windows, as ``recent`` + ``rank_stats``.

    ``figures(key, windows)`` is given a rank's newest windows (a live view's
    copy, oldest first) on every refresh and returns the windows in the span
    and their figures, equal to ``rank_stats(recent(windows, span_s))``.
    """

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self._ranks: dict[str, _RankSpan] = {}

    def figures(self, key: str, windows: Sequence[Window]) -> tuple[tuple[Window, ...], RankStats]:
        if not windows:
            self._ranks.pop(key, None)
            return (), rank_stats(())
        span = self._ranks.get(key)
        if span is None:
            span = self._ranks[key] = _RankSpan()
            self._restart(span, windows)
        elif not self._slide(span, windows):
            self._restart(span, windows)
        return span.figures()

    def keep_only(self, keys: Iterable[str]) -> None:
        """Forget the ranks not among ``keys`` (no longer in the view)."""
        keep = set(keys)
        for key in [k for k in self._ranks if k not in keep]:
            del self._ranks[key]

    def _restart(self, span: _RankSpan, windows: Sequence[Window]) -> None:
        """Sum the span afresh.  Out of time order, ``recent`` may skip windows in the middle: no sliding then."""
        span.rebuild(recent(windows, self.span_s))
        span.slides = _in_time_order(windows)

    def _slide(self, span: _RankSpan, windows: Sequence[Window]) -> bool:
        """The windows that arrived enter, those out of the span leave; False: start again instead.

        ``windows`` is the rank's newest windows and ``span`` a run of them that
        ended at ``span.windows[-1]``: the windows after it are new.  Anything
        else (the rank started over, more windows arrived than a view holds,
        a clock stepped back), or so many new windows that summing afresh is
        cheaper, restarts from ``windows``.
        """
        held = span.windows
        if not held or not span.slides:
            return False
        last = held[-1]
        i = _position(windows, last)
        if i is None:
            return False
        if len(windows) - 1 - i >= len(held):
            # As many windows to enter (and as many to leave) as the span holds: summing it afresh
            # costs less.  Sliding them one by one made a slow refresh slower (more windows by the
            # next), until 1,024 ranks' figures came every 15 s.
            return False
        if (first := i + 1 - len(held)) < 0:  # the view no longer holds the oldest: ``recent`` cannot see them
            for _ in range(-first):
                span.leave_oldest()
            first = 0
        if held and not _is_same(windows[first], held[0]):
            return False  # the view's windows are not the ones summed
        previous_t1 = last.t1
        for w in windows[i + 1 :]:
            if w.t1 < previous_t1:
                return False
            previous_t1 = w.t1
            span.enter(w)
        cutoff = windows[-1].t1 - self.span_s
        # ``recent`` reads only the view's windows: a span never reaches past them.
        while held and (held[0].t1 <= cutoff or len(held) > len(windows)):
            span.leave_oldest()
        return True
