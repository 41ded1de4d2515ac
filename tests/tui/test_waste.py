"""The dashboard shows what a finding costs, with its price."""

from __future__ import annotations

import pytest
from textual.theme import BUILTIN_THEMES

from gputop import report
from gputop.combine import PHASES
from gputop.export.metrics import families
from gputop.model.figures import SPAN_S, summarize
from gputop.model.source import FixedSource
from gputop.tui.app import GputopApp
from gputop.tui.palette import GREY
from gputop.tui.widgets.findings import FindingsPanel
from gputop.tui.widgets.header import HeaderBar
from tests.support.diagnose_fixtures import CUDA_STRAGGLER, findings_of, gpu_reading, make_snapshot
from tests.support.pilot import FAST_S, FakeDiagnoser, shown


async def test_the_dashboard_shows_the_waste_with_its_price() -> None:
    snapshot = make_snapshot(CUDA_STRAGGLER, seconds=20.0)
    diagnoser = FakeDiagnoser(findings_of(snapshot))  # the rules' own findings, shown at once
    app = GputopApp(FixedSource(snapshot), refresh_s=FAST_S, diagnoser_factory=lambda: diagnoser, price_per_hour=2.0)
    async with app.run_test(size=(160, 50)) as pilot:
        await shown(pilot)
        text = str(app.query_one(FindingsPanel).render())
        assert "GPU-hours an hour" in text and "per GPU-hour" in text, text


# The straggler's two GPUs, busy 60% and 80% of the span: 0.4 + 0.2 GPU-hours idle every hour.
BUSY_GPUS = [gpu_reading(0, util_pct=60.0), gpu_reading(1, util_pct=80.0)]


async def test_a_runs_idle_gpu_hours_show_in_the_header_the_report_and_the_exporter() -> None:
    snapshot = make_snapshot(CUDA_STRAGGLER, seconds=20.0, gpus=BUSY_GPUS)
    figures = summarize(snapshot, span_s=SPAN_S)
    (run,) = report.build(figures, price_per_hour=3.0)["runs"]
    assert run["idle_gpus"] == {"gpu_hours_per_hour": pytest.approx(0.6), "gpus": 2, "money_per_hour": 1.8}
    assert "its 2 GPUs sit idle 0.6 GPU-hours every hour (1.80 an hour" in report.render(snapshot, "text", (), 3.0)
    family = {f.spec.name: f for f in families(figures, [], gpu_hostname="node0")}["gputop_run_idle_gpu_hours_per_hour"]
    ((labels, value),) = family.samples
    assert labels == ("run",) and value == pytest.approx(0.6)
    app = GputopApp(FixedSource(snapshot), refresh_s=FAST_S, diagnoser_factory=lambda: FakeDiagnoser())
    async with app.run_test(size=(160, 50)) as pilot:
        await shown(pilot)
        assert "2 GPUs · idle 0.6 GPU-h/h" in app.query_one(HeaderBar).text


def test_the_phase_colours_differ_in_the_default_themes() -> None:
    """Side by side in every bar: two phases in one colour read as one (optimizer and exposed comm were both
    #ffa62b, accent and warning alike in textual-dark)."""
    for name in ("textual-dark", "textual-light"):
        theme = BUILTIN_THEMES[name]
        variables = {"error": theme.error, "primary": theme.primary, "secondary": theme.secondary,
                     "success": theme.success, "warning": theme.warning}  # fmt: skip
        colours = [variables[p.theme] if p.theme else GREY for p in PHASES]
        assert len(set(colours)) == len(colours), (name, colours)
