"""A rank's detail screen is drawn the moment it opens, not at the next refresh."""

from __future__ import annotations

from textual.widgets import Static

from gputop.model.source import FixedSource
from gputop.tui.app import GputopApp
from gputop.tui.screens.detail import RankDetailScreen
from gputop.tui.widgets.history import HistoryPanel
from tests.support import tui_fixtures as fx


async def test_the_detail_screen_shows_the_rank_before_any_second_refresh() -> None:
    # An hour between refreshes: only the first snapshot ever arrives.  At 1,024 ranks the
    # figures update every few seconds, and an empty detail screen read as "no data".
    app = GputopApp(FixedSource(fx.two_ranks(), description="fixed"), diagnoser_factory=None, refresh_s=3600)
    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(500):
            if app.view is not None:
                break
            await pilot.pause(0.01)
        assert app.view is not None, "no first snapshot in 5 s"
        await pilot.press("down", "enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RankDetailScreen), f"enter on rank 1 left {type(screen).__name__} on top"
        title = str(screen.query_one("#detail-title", Static).render())
        stats = str(screen.query_one("#detail-stats", Static).render())
        assert "rank 1" in title, f"title: {title!r}"
        assert "p50 49.5ms" in stats, f"stats: {stats!r}"
        history = screen.query_one(HistoryPanel).text
        assert "48ms" in history, f"history: {history!r}"
