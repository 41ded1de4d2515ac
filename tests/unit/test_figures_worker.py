"""The dashboard's figures thread, driven without Textual: views, alerts kept for the UI, a broken source."""

from __future__ import annotations

import threading

from gputop.diagnose import Diagnoser
from gputop.diagnose.alerts import AlertTracker
from gputop.diagnose.pipeline import RefreshPipeline
from gputop.model.snapshot import Snapshot
from gputop.model.source import FixedSource
from gputop.tui.figures_worker import Failed, FiguresWorker, Refreshed
from tests.support.diagnose_fixtures import SLOW_LOADER, make_snapshot


def test_each_refresh_is_a_view_and_the_alerts_wait_for_the_ui_however_many_views_it_skipped() -> None:
    source = FixedSource(make_snapshot(SLOW_LOADER))
    worker = FiguresWorker(source, RefreshPipeline(diagnoser=Diagnoser(), alerts=AlertTracker(hold_s=2.0)), 0.5, print)
    results = []
    for k in range(6):  # six refreshes the UI never drew (their views replaced each other in its queue)
        source.set(make_snapshot(SLOW_LOADER, seconds=10.0 + k))
        results.append(worker.refresh())
    assert all(isinstance(r, Refreshed) for r in results)
    assert results[-1].view.findings[0].cause == "straggler"
    alerts, briefs = worker.take_pending()
    assert [(a.kind, a.finding.cause) for a in alerts] == [("raised", "straggler")]
    assert "run" in briefs
    assert worker.take_pending() == ([], {})  # taken once


def test_the_selected_rank_is_focused_in_the_snapshot_and_its_series_computed() -> None:
    source = FixedSource(make_snapshot(SLOW_LOADER))
    worker = FiguresWorker(source, RefreshPipeline(), 0.5, print)
    worker.selected = "run:1"
    view = worker.refresh().view
    assert source.focus == frozenset({"run:1"})
    assert view.series("run:1") is view.series("run:1")  # computed on the worker, kept with the view


def test_a_source_that_raises_is_posted_as_a_failure_and_the_worker_goes_on() -> None:
    class Broken(FixedSource):
        def snapshot(self) -> Snapshot:
            raise OSError("the collector went away")

    posted: list[Refreshed | Failed] = []
    got_two = threading.Event()

    def post(result: Refreshed | Failed) -> None:
        posted.append(result)
        if len(posted) >= 2:
            got_two.set()

    worker = FiguresWorker(Broken(make_snapshot(SLOW_LOADER)), RefreshPipeline(), 0.01, post)
    worker.start()
    try:
        assert got_two.wait(10)
    finally:
        worker.stop()
    assert posted[0] == Failed("OSError: the collector went away")
