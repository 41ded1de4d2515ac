"""How the dashboard looks, from 80×24 to 200×60, from fixed data (pytest-textual-snapshot).

Regenerate after an intended change with ``pytest tests/tui/test_tui_snapshots.py --snapshot-update``
and look at the SVGs before committing them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from textual.pilot import Pilot

from gputop.diagnose.findings import Evidence, Finding
from gputop.model.figures import Figures
from gputop.model.snapshot import Snapshot
from gputop.model.source import FixedSource
from gputop.tui.app import GputopApp
from gputop.tui.screens.detail import RankDetailScreen
from tests.support import tui_fixtures as fx

SMALL = (80, 24)
LARGE = (160, 48)
SIZES = [(80, 24), (120, 40), (200, 60)]
SIZE_IDS = ["80x24", "120x40", "200x60"]

SnapCompare = Callable[..., bool]

FINDINGS = [
    Finding(
        cause="straggler",
        severity="critical",
        title="rank 5 holds the others back: they wait 25% of each step for it",
        suggestion="rank 5 waits for data 25% of its step: give its host more DataLoader workers",
        evidence=(Evidence("loader_wait_pct", 25.0, 5.0, "%", rank=5),),
        ranks=(5,),
        run_id="run-big",
        cost_s=0.028,  # what every other rank waits each 112-ms step: fixing it is worth 1.3x
        step_s=0.112,
    ),
    Finding(
        cause="allocation",
        severity="warn",
        title="pid 9999 (jupyter) holds 2.0 GiB on GPU 3, which rank 3 trains on",
        suggestion="stop the notebook kernel or move it to a GPU the job does not use",
        gpus=(3,),
    ),
]


class StaticDiagnoser:
    def __init__(self, findings: list[Finding]) -> None:
        self.findings = findings

    def update(self, figures: Figures) -> list[Finding]:
        return self.findings


# One snapshot per test: a second refresh racing the key presses on a loaded machine
# made a picture depend on timing (CI saw one detail screen differ).
ONE_FETCH_S = 3600.0


def make_app(snapshot: Snapshot, name: str, findings: list[Finding] | None = None) -> GputopApp:
    factory = (lambda: StaticDiagnoser(findings)) if findings is not None else None
    source = FixedSource(snapshot, description=f"fixed data: {name}")
    return GputopApp(source, diagnoser_factory=factory, refresh_s=ONE_FETCH_S)


async def wait_until(pilot: Pilot[Any], ready: Callable[[], bool], what: str) -> None:
    """Let the app run until ``ready()``; a slow machine waits longer, never shows a half-drawn state."""
    for _ in range(3000):
        if ready():
            await pilot.pause()
            return
        await pilot.pause(0.01)
    raise AssertionError(f"the dashboard never got to: {what}")


def after(*keys: str) -> Callable[[Pilot[Any]], Awaitable[None]]:
    """Wait for the first snapshot to be shown, then press ``keys``."""

    async def run_before(pilot: Pilot[Any]) -> None:
        app = pilot.app
        assert isinstance(app, GputopApp)
        await wait_until(pilot, lambda: app.view is not None, "its first snapshot")
        for key in keys:
            await pilot.press(key)
            await pilot.pause()
        if keys and keys[-1] == "enter" and app.view is not None and not app.view.empty:

            def opened() -> bool:  # a rank opens its detail screen; a host row unfolds in place
                cursor = app.main.table.selected_key or ""
                return isinstance(app.screen, RankDetailScreen) or cursor.startswith("host:")

            await wait_until(pilot, opened, f"what {keys} opens")
        if app.view is not None and not app.view.empty:  # the table's height follows its rows a layout later
            await wait_until(pilot, lambda: app.main.middle_fitted, "the table's height fitted to its rows")
        await pilot.pause()

    return run_before


EIGHT_FINDINGS = [
    Finding(
        cause="straggler",
        severity="warn",
        title="rank 6 is slow: it waits for data 30% of its step; the others wait for it 20% of each step",
        suggestion="rank 6's host (node-b) needs more DataLoader workers or faster storage",
        evidence=(Evidence("loader_wait_pct", 30.0, 5.0, "%", rank=6),),
        ranks=(6,),
        run_id="run-8",
    ),
]


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
class TestMainScreen:
    """The main screen at three sizes: phase bars per row, the run chart, GPUs, host rows (folded at 64)."""

    def test_two_ranks(self, snap_compare: SnapCompare, size: tuple[int, int]) -> None:
        assert snap_compare(make_app(fx.two_ranks(), "two_ranks", []), terminal_size=size, run_before=after())

    def test_eight_ranks_on_two_hosts(self, snap_compare: SnapCompare, size: tuple[int, int]) -> None:
        app = make_app(fx.eight_ranks(), "eight_ranks", EIGHT_FINDINGS)
        assert snap_compare(app, terminal_size=size, run_before=after())

    def test_sixty_four_ranks_folded(self, snap_compare: SnapCompare, size: tuple[int, int]) -> None:
        assert snap_compare(make_app(fx.big_run(), "big_run", FINDINGS), terminal_size=size, run_before=after())


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "160x48"])
class TestTwoRanks:
    """A 2-rank CUDA run where rank 1 waits for data: its detail screen."""

    def test_detail(self, snap_compare: SnapCompare, size: tuple[int, int]) -> None:
        app = make_app(fx.two_ranks(), "two_ranks", [])
        assert snap_compare(app, terminal_size=size, run_before=after("down", "enter"))


class TestBigRunOpen:
    """64 ranks with one host opened: its ranks under its summary row, the straggler marked."""

    def test_host_opened(self, snap_compare: SnapCompare) -> None:
        app = make_app(fx.big_run(), "big_run", FINDINGS)
        assert snap_compare(app, terminal_size=LARGE, run_before=after("enter"))


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "160x48"])
class TestNoGpu:
    """A CPU gloo run on a machine without NVML: one line says why, memory is N/A."""

    def test_main(self, snap_compare: SnapCompare, size: tuple[int, int]) -> None:
        assert snap_compare(make_app(fx.no_gpu(), "no_gpu"), terminal_size=size, run_before=after())


class TestEmpty:
    """Nothing reports yet: where the dashboard listens and the two lines to add."""

    def test_small(self, snap_compare: SnapCompare) -> None:
        assert snap_compare(make_app(fx.empty(), "empty"), terminal_size=SMALL, run_before=after())
