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


async def test_the_detail_screen_lists_the_ranks_collectives_a_step() -> None:
    """An FSDP2 rank: each collective kind on its mesh dimension, with calls, size, time in flight and exposed, and
    how long of it the rank waited for the one that reached it last (rank 1, in the all-gathers)."""
    snapshot = fx.fsdp2_ranks(last_gather_exposed_s=0.004)
    app = GputopApp(FixedSource(snapshot, description="fixed"), diagnoser_factory=None, refresh_s=3600)
    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(500):
            if app.view is not None:
                break
            await pilot.pause(0.01)
        await pilot.press("enter")
        await pilot.pause()
        section = app.screen.query_one("#detail-collectives", Static)
        text = str(section.render())
        assert section.display and "collectives, a step" in text and "from the model's hooks" in text, text
        lines = text.splitlines()
        gather = next(line for line in lines if line.strip().startswith("all_gather"))
        assert gather.split()[:4] == ["all_gather", "dp", "7", "92.8"], gather  # 95,000 B = 92.8 KiB each
        # In flight, exposed, bus bandwidth (nccl-tests': 2 x 95,000 B in 24/7 ms, x (2-1)/2), waiting for rank 1.
        assert gather.split()[5:] == ["24ms", "21ms", "27.7", "MB/s", "17ms,", "for", "rank", "1"], gather
        await pilot.press("escape", "down", "enter")
        await pilot.pause()
        text = str(app.screen.query_one("#detail-collectives", Static).render())
        gather = next(line for line in text.splitlines() if line.strip().startswith("all_gather"))
        assert gather.endswith("4ms  27.7 MB/s  last to arrive"), gather  # rank 1's own line
        scatter = next(line for line in lines if line.strip().startswith("reduce_scatter"))
        assert scatter.endswith("(they arrive together)"), scatter  # both wait 9 ms: no rank is named
