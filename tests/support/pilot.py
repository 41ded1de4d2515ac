"""Driving the dashboard through the pilot: waiting until it shows a snapshot, reading its table, a fake diagnosis."""

from __future__ import annotations

import time
from collections.abc import Sequence

from textual.pilot import Pilot

from gputop.diagnose.findings import Finding
from gputop.model.figures import Figures
from gputop.model.snapshot import Snapshot
from gputop.tui.app import GputopApp
from gputop.tui.widgets.ranks_table import RanksTable

FAST_S = 0.05  # tests poll faster than a user would, to stay quick


async def shown(pilot: Pilot[int], snapshot: Snapshot | None = None, *, timeout_s: float = 30.0) -> GputopApp:
    """Wait until the app shows ``snapshot`` (or any snapshot), and return the app.

    A deadline in seconds, not a count of pauses: the figures thread holds itself
    to a share of a core, so on 2 cores shared with other suites a 64-rank refresh
    comes seconds later than on a quiet machine, and 200 pauses of 25 ms ran out.
    """
    app = pilot.app
    assert isinstance(app, GputopApp)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = app.view
        if view is not None and (snapshot is None or view.snapshot is snapshot):
            await pilot.pause()
            return app
        await pilot.pause(FAST_S / 2)
    raise AssertionError(f"the dashboard did not show the snapshot within {timeout_s:.0f} s")


def table_text(app: GputopApp) -> list[list[str]]:
    table = app.query_one(RanksTable)
    return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]


class FakeDiagnoser:
    """Returns what it is told to, and counts its calls."""

    def __init__(self, findings: Sequence[Finding] = (), fail: bool = False) -> None:
        self.findings = list(findings)
        self.fail = fail
        self.calls = 0

    def update(self, figures: Figures) -> list[Finding]:
        self.calls += 1
        if self.fail:
            raise RuntimeError("rule exploded")
        return self.findings
