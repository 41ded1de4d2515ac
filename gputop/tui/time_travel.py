"""The views the dashboard keeps to step back through, and where it stands among them: plain data, no Textual.

``[`` pauses and shows the view one refresh earlier, ``]`` one later, and
past the newest the dashboard is live again.  A past view holds its figures
and rows, not its windows (but the drawn rank's: ``DashboardView.for_time_travel``),
and the views kept are bounded by rank-views, so a thousand ranks keep a few
moments and two ranks ten minutes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from gputop.tui.view import DashboardView

# Past views kept, as rank-views (a view of 1,024 ranks counts 1,024): 10 minutes at
# 2 Hz for a 2-rank job, a minute at 64 ranks, the last 7 moments at 1,024 (where
# 20,000 held RSS near 575 MiB when past views kept their windows).
PAST_BUDGET_RANKS = 8_000
PAST_MIN_VIEWS = 5
PAST_MAX_VIEWS = 1200


class Past:
    """The views kept, newest last, and how many refreshes back the one shown is (0: the newest)."""

    def __init__(self) -> None:
        self._views: deque[DashboardView] = deque(maxlen=PAST_MAX_VIEWS)
        self.back = 0

    def __iter__(self) -> Iterator[DashboardView]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)

    def remember(self, view: DashboardView, *, paused: bool) -> None:
        """Keep a new view, one per moment; while paused, keep pointing at the view on screen."""
        views = self._views
        if views and views[-1].snapshot.t == view.snapshot.t:
            views[-1] = view  # the same moment again (a finished replay, fixed data): nothing to step through
            return
        if views:
            views[-1] = views[-1].for_time_travel()  # no longer the newest: its windows are the store's to keep
        views.append(view)
        if paused:
            self.back += 1
        keep = max(PAST_BUDGET_RANKS // max(len(view.rank_rows), 1), PAST_MIN_VIEWS)
        while len(views) > keep:
            views.popleft()
        self.back = min(self.back, len(views) - 1)

    def step_back(self) -> DashboardView | None:
        """One refresh earlier (the oldest kept at most); None when nothing is kept yet."""
        if not self._views:
            return None
        self.back = min(self.back + 1, len(self._views) - 1)
        return self.shown

    def step_forward(self) -> DashboardView | None:
        """One refresh later; None past the newest: back to live."""
        if self.back == 0:
            return None
        self.back -= 1
        return self.shown

    def go_live(self) -> None:
        self.back = 0

    @property
    def shown(self) -> DashboardView:
        return self._views[-1 - self.back]

    @property
    def behind_s(self) -> float:
        """How far the shown view is behind the newest, in snapshot seconds."""
        return self._views[-1].snapshot.t - self.shown.snapshot.t if self._views else 0.0
