"""`gputop fleet`'s live view: a run, its slowest rank, that rank's node read live, and a Prometheus gone.

The app reads a real HTTP server in Prometheus's shape (tests/support/prometheus_api.py)
whose slow rank is exported by gputop's real exporter, so enter opens a node page
gputop really serves.
"""

from __future__ import annotations

import contextlib
import os
import pty
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from textual.binding import Binding
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from gputop.fleet.query import Prometheus
from gputop.tui.fleet.app import FLEET_HELP, FleetApp
from gputop.tui.fleet.node_screen import FleetNodeScreen
from gputop.tui.fleet.screen import FleetScreen
from gputop.tui.shell import Shell
from tests.support.prometheus_api import PrometheusAPI, exporting_two_ranks, record_two_rank_run


@pytest.fixture
def exporter() -> Iterator[str]:
    """gputop's exporter over a 2-rank run on node-a; its instance (host:port)."""
    with exporting_two_ranks() as instance:
        yield instance


@pytest.fixture
def prometheus(exporter: str) -> Iterator[PrometheusAPI]:
    """Prometheus's API with the job rules' view of that run, scraped every second."""
    api = PrometheusAPI()
    record_two_rank_run(api, exporter, interval="1s")
    api.start()
    yield api
    api.stop()


def rows(table: DataTable[object]) -> list[list[str]]:
    return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]


def text(widget: Static) -> str:
    return str(widget.render())


async def until(pilot: Pilot[int], done: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Wait for ``done()``: a deadline in seconds, for a shared two-core machine."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return
        await pilot.pause(0.05)
    raise AssertionError(f"not seen within {timeout_s:.0f} s: {what}")


async def test_a_slow_rank_opens_its_node_and_a_lost_prometheus_leaves_the_runs_stale(
    prometheus: PrometheusAPI, exporter: str
) -> None:
    app = FleetApp(FleetScreen(Prometheus(prometheus.url)))
    async with app.run_test(size=(160, 44)) as pilot:
        await until(pilot, lambda: app.main.runs_table.row_count == 1, "the run")
        # Read at Prometheus's scrape interval for gputop's job, and said so.
        assert app.main.interval_s == 1.0
        assert "read every 1 s: the scrape interval of job 'gputop'" in text(app.main.header)
        (run,) = rows(app.main.runs_table)
        assert run == ["run-a", "2", "50ms", "20", "23%", "N/A", "41%", "0.3", "firing critical data_loading"]
        assert "N/A comm: no rank of the run reports exposed communication" in text(app.main.run_na)
        assert rows(app.main.slowest_table)[0] == [
            "1",
            "node-a",
            exporter,
            "+21%",
            "N/A",
        ]  # no collective timed: last in none

        await pilot.press("enter")  # on the run: to its slowest ranks
        assert app.focused is app.main.slowest_table
        await pilot.press("enter")  # on rank 1: its node, read from its exporter
        screen = app.screen
        assert isinstance(screen, FleetNodeScreen) and screen.instance == exporter
        ranks = screen.query_one("#node-ranks", DataTable)
        await until(pilot, lambda: ranks.row_count == 2, "the node's ranks")
        assert [row[:4] for row in rows(ranks)] == [["run-a", "0", "node-a", "50ms"], ["run-a", "1", "node-a", "50ms"]]
        assert ranks.cursor_row == 1, "the cursor is on the rank the user opened"
        assert screen.query_one("#node-gpus", DataTable).row_count == 2
        await pilot.press("escape")
        assert app.screen is not screen

        prometheus.stop()  # Prometheus goes away: the next refresh fails, the app stays
        gone = f"cannot reach Prometheus at {prometheus.url}: Connection refused"
        await until(pilot, lambda: gone in text(app.main.status), "the one-line error")
        assert "showing what was read" in text(app.main.status) and "(stale)" in text(app.main.status)
        assert rows(app.main.runs_table)[0][0] == "run-a", "the last runs read stay on screen"
        assert "stale: read" in str(app.main.runs_box.border_title)

        prometheus.start()  # back on the same port: the next good read clears the error
        await until(pilot, lambda: "cannot reach" not in text(app.main.status), "the recovery")
        assert "stale" not in str(app.main.runs_box.border_title)


async def test_a_node_whose_exporter_is_gone_says_so_in_one_line(prometheus: PrometheusAPI) -> None:
    app = FleetApp(FleetScreen(Prometheus(prometheus.url), interval_s=60))
    async with app.run_test(size=(160, 44)) as pilot:
        await until(pilot, lambda: app.main.runs_table.row_count == 1, "the run")
        assert "read every 60 s: --interval" in text(app.main.header)
        app.main.open_node("127.0.0.1:9", ("run-a", "1"), "rank 1")  # port 9 (discard): nothing listens
        await pilot.pause()
        status = app.screen.query_one("#node-status", Static)
        await until(pilot, lambda: "cannot reach the exporter" in text(status), "the node's error")
        assert text(status).startswith("cannot reach the exporter at http://127.0.0.1:9/metrics: Connection refused")


async def test_the_cursor_stays_on_its_run_when_the_runs_change_order(prometheus: PrometheusAPI, exporter: str) -> None:
    record_two_rank_run(prometheus, exporter, run="run-b")
    app = FleetApp(FleetScreen(Prometheus(prometheus.url), interval_s=60))
    async with app.run_test(size=(160, 44)) as pilot:
        await until(pilot, lambda: app.main.runs_table.row_count == 2, "the runs")
        await pilot.press("down")
        assert app.main.highlighted is not None and app.main.highlighted.run == "run-b"
        alerts = prometheus.answers['ALERTS{alertname=~"Gputop.*"}']
        alerts[:] = [a for a in alerts if a["metric"].get("run") == "run-b"]  # run-a's alerts clear: run-b first
        await pilot.press("r")
        await until(pilot, lambda: rows(app.main.runs_table)[0][0] == "run-b", "run-b, firing, first")
        await pilot.pause()
        assert app.main.highlighted is not None and app.main.highlighted.run == "run-b"
        assert "slowest ranks of run-b" in str(app.main.slowest_box.border_title)


def test_the_fleet_help_lists_every_key() -> None:
    """Each key the fleet app binds, its own and its shell's, is in its ? help, as the user types it."""
    for binding in [*Shell.BINDINGS, *FleetApp.BINDINGS]:
        assert isinstance(binding, Binding)
        shown = binding.key_display or binding.key
        assert f"`{shown}`" in FLEET_HELP, f"{binding.action} ({shown}) is missing from the help"


def test_on_a_terminal_the_command_opens_the_live_view(prometheus: PrometheusAPI) -> None:
    """What decides it: stdout is a terminal and no --format was given; q leaves with 0."""
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "30"}
    command = [sys.executable, "-m", "gputop", "fleet", prometheus.url]
    proc = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    drawn: list[bytes] = []

    def drain() -> None:
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 65536):
                drawn.append(chunk)

    threading.Thread(target=drain, daemon=True).start()
    try:
        deadline = time.monotonic() + 60
        while b"slowest ranks of run-a" not in b"".join(drawn) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert b"slowest ranks of run-a" in b"".join(drawn), f"never drew: {b''.join(drawn)[-300:]!r}"
        os.write(master, b"q")
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        os.close(master)
