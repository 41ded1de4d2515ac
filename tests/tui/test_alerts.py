"""The dashboard's alerts: the terminal bell and a notification when a finding holds, and again when it clears."""

from __future__ import annotations

import dataclasses

from gputop.diagnose.alerts import AlertTracker
from gputop.diagnose.findings import Evidence, Finding
from gputop.model.source import FixedSource
from gputop.tui.app import GputopApp
from tests.support import tui_fixtures as fx
from tests.support.pilot import FAST_S, FakeDiagnoser, shown

LOADER = Finding(
    cause="data_loading",
    severity="warn",
    title="ranks wait for data 42% of each step",
    suggestion="DataLoader(num_workers=8)",
    evidence=(Evidence("loader_wait_pct", 42.0, 5.0, "%"),),
    ranks=(0, 1),
    run_id="r",
)


class TestDashboardAlerts:
    """The dashboard rings the terminal bell and shows a notification."""

    async def test_bell_and_notification_once_then_cleared(self) -> None:
        diagnoser = FakeDiagnoser([LOADER])
        snapshot = fx.two_ranks()
        source = FixedSource(snapshot)
        app = GputopApp(source, refresh_s=FAST_S, diagnoser_factory=lambda: diagnoser, alerts=AlertTracker(hold_s=0))
        bells: list[int] = []
        app.bell = lambda: bells.append(1)  # type: ignore[method-assign]
        async with app.run_test(size=(120, 40)) as pilot:
            await shown(pilot)
            for _ in range(5):
                await pilot.pause(FAST_S)
            assert bells == [1]
            titles = [n.title for n in app._notifications]
            assert titles.count("warn: data_loading") == 1
            diagnoser.findings = []
            later = dataclasses.replace(snapshot, t=snapshot.t + 1)
            source.set(later)
            await shown(pilot, later)
            assert "cleared: data_loading" in [n.title for n in app._notifications]
            assert bells == [1]
