"""Where each rank's training thread is, on the detail screen: its newest place and where it spends the most."""

from __future__ import annotations

from textual.widgets import Static

from gputop.model.source import FixedSource
from gputop.tui.app import GputopApp
from gputop.tui.screens.detail import RankDetailScreen
from tests.support import tui_fixtures as fx
from tests.support.frames import METRIC, stacks, with_stacks


async def test_the_detail_screen_says_where_the_training_thread_is() -> None:
    snapshot = fx.two_ranks()
    t = snapshot.t
    shown = with_stacks(snapshot, {1: [stacks(1, t - 1, top=(METRIC,), run_id="run-a")]})
    app = GputopApp(FixedSource(shown, description="fixed"), diagnoser_factory=None, refresh_s=3600)
    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(500):
            if app.view is not None:
                break
            await pilot.pause(0.01)
        await pilot.press("down", "enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RankDetailScreen)
        section = screen.query_one("#detail-frames", Static)
        text = str(section.render())
        assert section.display and "where the training thread is" in text, text
        assert "now    in `wait_for_lock` (train.py:102), after the optimizer step   1 s ago" in text, text
        assert "38%   in `compute_metrics` (train.py:57), after the optimizer step" in text, text
        await pilot.press("escape", "up", "enter")  # rank 0 sends no stacks: no section
        await pilot.pause()
        assert not app.screen.query_one("#detail-frames", Static).display
