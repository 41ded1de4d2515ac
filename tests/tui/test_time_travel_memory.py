"""A view kept for time travel shows what it showed, but holds only the windows of the ranks whose history was drawn."""

from __future__ import annotations

from gputop.model.figures import summarize
from gputop.model.source import FixedSource
from gputop.tui.app import GputopApp
from gputop.tui.time_travel import Past
from gputop.tui.view import build_view
from tests.support import tui_fixtures as fx
from tests.support.pilot import FAST_S, shown


def test_a_past_view_keeps_its_figures_and_the_drawn_history() -> None:
    view = build_view(summarize(fx.eight_ranks()))
    focused, other = view.rank_rows[0].key, view.rank_rows[1].key
    drawn = view.series(focused)
    past = view.for_time_travel()
    assert past.rank_rows is view.rank_rows and past.findings is view.findings
    assert past.snapshot.t == view.snapshot.t and past.snapshot.gpu_history is view.snapshot.gpu_history
    assert past.series(focused) is drawn
    assert past.rank(focused) == view.rank(focused)
    past_figures, view_figures, past_rank = past.figures.rank(other), view.figures.rank(other), past.rank(other)
    assert past_figures is not None and view_figures is not None and past_rank is not None
    assert past_figures.stats is view_figures.stats
    assert past_rank.windows == () and past_figures.windows == ()


async def test_views_older_than_the_newest_hold_no_undrawn_windows() -> None:
    source = FixedSource(fx.eight_ranks(n_windows=40))
    async with GputopApp(source, refresh_s=FAST_S).run_test(size=(120, 40)) as pilot:
        app = await shown(pilot)
        later = fx.eight_ranks(n_windows=50)
        source.set(later)
        await shown(pilot, later)
        *past, newest = app.past
        assert newest.snapshot is later
        assert past and all(len(run.ranks) == 8 for view in past for run in view.snapshot.runs)
        kept = {rank.key for view in past for rank in view.snapshot.all_ranks() if rank.windows}
        assert kept <= {app.main.selected}, kept


def test_stepping_back_and_forward_through_the_kept_views() -> None:
    """[ goes one refresh back (the oldest at most), ] one forward, and past the newest means live again."""
    views = [build_view(summarize(fx.eight_ranks(n_windows=n))) for n in (40, 41, 42)]
    past = Past()
    assert past.step_back() is None  # nothing kept yet
    for view in views:
        past.remember(view, paused=False)
    assert past.step_back() is not None and past.shown.snapshot.t == views[1].snapshot.t
    assert past.behind_s == views[2].snapshot.t - views[1].snapshot.t
    past.remember(build_view(summarize(fx.eight_ranks(n_windows=43))), paused=True)  # arrives while paused
    assert past.shown.snapshot.t == views[1].snapshot.t  # the screen does not move
    past.step_back()
    past.step_back()
    past.step_back()
    assert past.shown.snapshot.t == views[0].snapshot.t  # the oldest kept, no further
    while past.step_forward() is not None:
        pass
    assert past.back == 0  # at the newest: the next ] is live
