"""The dashboard shows what a finding costs, with its price."""

from __future__ import annotations

from gputop.model.source import FixedSource
from gputop.tui.app import GputopApp
from gputop.tui.widgets.findings import FindingsPanel
from tests.support.diagnose_fixtures import CUDA_STRAGGLER, findings_of, make_snapshot
from tests.support.pilot import FAST_S, FakeDiagnoser, shown


async def test_the_dashboard_shows_the_waste_with_its_price() -> None:
    snapshot = make_snapshot(CUDA_STRAGGLER, seconds=20.0)
    diagnoser = FakeDiagnoser(findings_of(snapshot))  # the rules' own findings, shown at once
    app = GputopApp(FixedSource(snapshot), refresh_s=FAST_S, diagnoser_factory=lambda: diagnoser, price_per_hour=2.0)
    async with app.run_test(size=(160, 50)) as pilot:
        await shown(pilot)
        text = str(app.query_one(FindingsPanel).render())
        assert "GPU-hours an hour" in text and "per GPU-hour" in text, text
