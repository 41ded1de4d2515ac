"""A refresh repaints only what changed: the dashboard costs next to nothing while its figures stand still.

Counted where Textual draws: every line a widget renders anew goes through its
styles cache's ``render_line``; a line that did not change comes from the cache.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from textual._styles_cache import StylesCache
from textual.app import App, ComposeResult
from textual.pilot import Pilot
from textual.screen import Screen
from textual.widget import Widget

from gputop.diagnose.findings import Finding
from gputop.model.figures import RankSeries
from gputop.model.samples import GpuSample
from gputop.model.snapshot import RunHistory, Snapshot
from gputop.model.source import FixedSource
from gputop.tui.app import GputopApp, run_dashboard
from gputop.tui.titles import set_border_title
from gputop.tui.widgets.history import HistoryPanel
from tests.support import tui_fixtures as fx
from tests.support.pilot import shown


@pytest.fixture
def repainted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Lines rendered anew, by widget id, while the test runs."""
    counts: Counter[str] = Counter()
    render_widget, render_line = StylesCache.render_widget, StylesCache.render_line
    drawing: list[str] = [""]

    def counting_render_widget(self: StylesCache, widget: Widget, crop: object) -> object:
        drawing[0] = widget.id or type(widget).__name__
        return render_widget(self, widget, crop)  # type: ignore[arg-type]

    def counting_render_line(self: StylesCache, *args: object, **kwargs: object) -> object:
        counts[drawing[0]] += 1
        return render_line(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(StylesCache, "render_widget", counting_render_widget)
    monkeypatch.setattr(StylesCache, "render_line", counting_render_line)
    yield counts


REFRESH_S = 0.2  # slow enough that figures keep up (a header saying "figures every …" would change)
REFRESH_WAIT_S = 10.0


async def until(pilot: Pilot[int], done: Callable[[], bool]) -> float:
    """Pause until ``done()`` (at most REFRESH_WAIT_S); the seconds waited.

    Figures come at most at 5% of a core's duty: on a busy machine one slow
    refresh puts the next off by 20 times its cost, so a test waits for what
    it needs rather than for a count of refresh periods.
    """
    started = time.monotonic()
    while not done() and time.monotonic() - started < REFRESH_WAIT_S:
        await pilot.pause(REFRESH_S)
    return time.monotonic() - started


@pytest.mark.parametrize("fixture", ["two_ranks", "eight_ranks", "remote_gpus"])
async def test_refreshes_of_unchanged_figures_repaint_nothing(repainted: Counter[str], fixture: str) -> None:
    source = FixedSource(getattr(fx, fixture)())
    async with GputopApp(source, refresh_s=REFRESH_S).run_test(size=(160, 48)) as pilot:
        app = await shown(pilot)
        # The first paints done: a refresh after the first view, and its paint. A fixed pause was too short
        # on 2 cores shared with another suite, and a late first paint was counted as a repaint.
        first = app.view
        await until(pilot, lambda: app.view is not first)
        await pilot.pause(2 * REFRESH_S)
        repainted.clear()
        refreshed = app.view
        waited = await until(pilot, lambda: app.view is not refreshed)
        assert app.view is not refreshed, f"no refresh happened in {waited:.1f} s of counting"
        await pilot.pause(2 * REFRESH_S)  # its paint
        assert not repainted, f"unchanged figures repainted {dict(repainted)} (lines by widget)"


async def test_a_title_repaints_only_when_it_changes() -> None:
    source = FixedSource(fx.two_ranks())
    async with GputopApp(source, refresh_s=REFRESH_S).run_test(size=(120, 40)) as pilot:
        app = await shown(pilot)
        box = app.main.findings_box
        refreshes: list[object] = []
        box.refresh = lambda *a, **k: refreshes.append(a) or box  # type: ignore[method-assign]
        set_border_title(box, "findings (2)")
        set_border_title(box, "findings (2)")
        assert len(refreshes) == 1
        set_border_title(box, "[b]findings (2)[/b]")  # same text, another style: shown
        assert len(refreshes) == 2
        assert box.border_title == "[b]findings (2)[/b]"


class CountingDiagnoser:
    """A finding whose figure moves on every refresh, as a live run's do; its text keeps its length."""

    def __init__(self) -> None:
        self.calls = 0

    def update(self, figures: object) -> list[Finding]:
        self.calls += 1
        return [
            Finding(
                cause="data_loading",
                severity="warn",
                title=f"rank 1 waits for data {40 + self.calls % 10}% of each step",
                suggestion="DataLoader(num_workers=8, pin_memory=True, persistent_workers=True)",
                ranks=(1,),
            )
        ]


async def test_a_moving_finding_repaints_its_panel_without_laying_out_the_screen(
    repainted: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    layouts: list[object] = []
    refresh_layout = Screen._refresh_layout  # what a widget's refresh(layout=True) comes to

    def counting_refresh_layout(self: Screen[object], *args: object, **kwargs: object) -> None:
        layouts.append(args)
        refresh_layout(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Screen, "_refresh_layout", counting_refresh_layout)
    source = FixedSource(fx.two_ranks())
    app = GputopApp(source, refresh_s=REFRESH_S, diagnoser_factory=CountingDiagnoser)
    async with app.run_test(size=(160, 48)) as pilot:
        await shown(pilot)
        await pilot.pause(3 * REFRESH_S)
        repainted.clear()
        layouts.clear()
        await until(pilot, lambda: repainted["findings"] > 0)
        await pilot.pause(2 * REFRESH_S)
        assert repainted["findings"] > 0, "the finding's new figure was never drawn"
        others = {widget: n for widget, n in repainted.items() if widget != "findings"}
        assert not others, f"a finding's figure repainted other widgets too: {others} (lines by widget)"
        assert not layouts, f"the screen was laid out {len(layouts)} times for figures that kept their lines"


class TestTheRunChartRepaintsTheLinesThatChanged:
    """The run chart is most of a tall screen; new data repaints its lines that changed, not all of them."""

    async def test_a_gpu_sample_on_a_machine_without_gpus_repaints_no_chart_line(self, repainted: Counter[str]) -> None:
        # Without NVML the GPU sampler still adds a sample (saying why) every second: no GPU lines change.
        snapshot = fx.no_gpu()
        source = FixedSource(snapshot)
        async with GputopApp(source, refresh_s=REFRESH_S).run_test(size=(160, 48)) as pilot:
            app = await shown(pilot)
            await pilot.pause(3 * REFRESH_S)
            repainted.clear()
            for second in range(1, 4):
                unavailable = GpuSample(t=snapshot.t + second, unavailable="NVML library not found")
                source.set(replace(snapshot, gpu_history=(*snapshot.gpu_history, unavailable)))

                def arrived(t: float = unavailable.t) -> bool:
                    return app.main.chart.gpu_history[-1].t == t

                await until(pilot, arrived)
            assert app.main.chart.gpu_history[-1].t == snapshot.t + 3, "the chart never got the new samples"
            assert not repainted["run-chart"], f"{repainted['run-chart']} chart lines repainted for the same lines"

    async def test_a_new_second_repaints_only_the_lines_it_changed(self, repainted: Counter[str]) -> None:
        seconds = 400  # wider than the chart: every column holds a second
        snapshot = _with_history(fx.two_ranks(), [0.1] * seconds)
        source = FixedSource(snapshot)
        async with GputopApp(source, refresh_s=REFRESH_S).run_test(size=(160, 48)) as pilot:
            app = await shown(pilot)
            await pilot.pause(3 * REFRESH_S)
            before = app.main.chart.text.splitlines()
            repainted.clear()
            source.set(_with_history(snapshot, [0.1] * seconds + [0.05]))  # the newest second's steps twice as fast
            await until(pilot, lambda: app.main.chart.text.splitlines() != before)
            await pilot.pause(REFRESH_S)
            after = app.main.chart.text.splitlines()
            changed = sum(a != b for a, b in zip(before, after, strict=True))
            assert 0 < changed < len(after) // 2, "the test's second should change the top of the step-time bars"
            assert repainted["run-chart"] == changed, f"{repainted['run-chart']} lines repainted for {changed} changed"


def _with_history(snapshot: Snapshot, step_time_s: list[float]) -> Snapshot:
    """The snapshot with its run's per-second history replaced: these step times, 640 samples a second."""
    n = len(step_time_s)
    history = RunHistory(
        first_s=float(int(snapshot.t) - n),
        step_time_s=tuple(step_time_s),
        samples_per_s=(640.0,) * n,
    )
    return replace(snapshot, runs=(replace(snapshot.runs[0], history=history), *snapshot.runs[1:]))


class HistoryApp(App[None]):
    def compose(self) -> ComposeResult:
        yield HistoryPanel(id="history")


async def test_a_new_window_repaints_only_the_history_lines_it_changed(repainted: Counter[str]) -> None:
    # A new window of a rank whose loader wait and communication stay where they were: the step
    # time's sparkline moves, the other lines and the panel's title line do not.
    async with HistoryApp().run_test(size=(100, 10)) as pilot:
        panel = pilot.app.query_one(HistoryPanel)
        panel.border_title = "history"
        panel.styles.border_top = ("solid", "blue")
        steps = [0.05 + 0.01 * (i % 3) for i in range(40)]
        flat = (0.1,) * 40
        panel.series = RankSeries(tuple(steps), flat, flat, (50.0,) * 40)
        await pilot.pause()
        repainted.clear()
        panel.series = RankSeries((*steps[1:], 0.09), flat, flat, (50.0,) * 40)
        await pilot.pause()
        assert "90ms" in panel.text, "the new window was not drawn"
        assert repainted["history"] == 1, f"{repainted['history']} lines repainted for the one that changed"


async def test_the_dashboard_hides_its_startup_objects_from_full_collections(monkeypatch: pytest.MonkeyPatch) -> None:
    # The modules, the stylesheet and the widgets live as long as the dashboard: a full collection
    # that walked them all every half minute was a sixth of a 2-rank dashboard's CPU.
    ran: list[object] = []
    monkeypatch.setattr("gputop.tui.app.GputopApp.run", lambda app: ran.append(app) or 0)
    monkeypatch.setattr("gputop.tui.shell.exit_when_the_terminal_goes", lambda *a, **k: None)
    monkeypatch.setattr("sys.setswitchinterval", lambda interval: None)  # this process is pytest's
    run_dashboard(FixedSource(fx.two_ranks()))
    (app,) = ran
    assert isinstance(app, GputopApp) and app.freeze_startup_objects

    app = GputopApp(FixedSource(fx.two_ranks()), refresh_s=REFRESH_S)
    app.freeze_startup_objects = True
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await shown(pilot)
            await pilot.pause(REFRESH_S)
            assert gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()
