"""`gputop replay`: a recording shown in the same dashboard, at the recorded pace or faster."""

from __future__ import annotations

import time

from gputop.collect.replay import ReplaySource
from gputop.tui.app import GputopApp
from gputop.tui.widgets.header import HeaderBar
from tests.support.pilot import FAST_S, shown, table_text
from tests.support.recordings import write_run


def test_replay_reaches_the_end_of_the_recording_at_its_speed(tmp_path) -> None:
    path = tmp_path / "run.jsonl"
    write_run(path, windows=4)  # spans 3 s of recording time
    source = ReplaySource(path, speed=20.0)
    source.start()
    first = source.snapshot()
    assert first.runs and len(first.all_ranks()[0].windows) <= 1  # the start, not the end
    deadline = time.monotonic() + 5
    while not source.finished and time.monotonic() < deadline:
        time.sleep(0.02)
    assert source.finished
    (view,) = source.snapshot().all_ranks()
    assert len(view.windows) == 4 and view.status == "done"
    source.stop()


async def test_the_dashboard_shows_a_replayed_run(tmp_path) -> None:
    path = tmp_path / "run.jsonl"
    write_run(path, windows=6)
    source = ReplaySource(path, speed=50.0)
    source.start()
    async with GputopApp(source, refresh_s=FAST_S).run_test(size=(120, 40)) as pilot:
        app = await shown(pilot)
        for _ in range(100):
            if source.finished:
                break
            await pilot.pause(FAST_S)
        await pilot.pause(FAST_S * 3)
        rows = table_text(app)
        assert [r[0].strip(" ▲") for r in rows] == ["0"]
        assert rows[0][-1] == "done"  # the recording ends with the rank's bye
        assert "replay of run.jsonl" in app.query_one(HeaderBar).text
    source.stop()
