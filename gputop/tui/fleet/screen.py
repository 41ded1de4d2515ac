"""``gputop fleet``'s screen: the runs a cluster's Prometheus knows, live, and a key to a node's detail.

It lists each run the job rules record (docs/prometheus.md), and
for the highlighted one its slowest ranks and the gputop alerts at work on it.
Prometheus's figures change once a scrape, so the screen reads them once a scrape
interval (Prometheus's own, from its targets API; ``--interval`` overrides),
off the UI thread: a thread worker posts ``FleetRead`` or ``FleetFailed``, and
the next read is timed from the answer, so reads never pile up.  A failed read
keeps the last runs on screen, marked stale with their age, and says the one
line why; the next good read clears it.  Enter on a slow rank, or on an alert
that names one, opens that rank's node read from its exporter directly
(``node_screen``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Static
from textual.worker import Worker, WorkerState

from gputop.fleet.node import metrics_url
from gputop.fleet.query import (
    DEFAULT_INTERVAL_S,
    FiringAlert,
    FleetError,
    FleetRun,
    Prometheus,
    Scraping,
    missing_reasons,
    read_fleet,
    read_scraping,
    stopped,
)
from gputop.tui.fleet.cells import ALERT_COLUMNS, RUN_COLUMNS, SLOW_COLUMNS, alert_cells, run_cells, slow_cells
from gputop.tui.fleet.messages import FleetFailed, FleetRead
from gputop.tui.fleet.node_screen import FleetNodeScreen
from gputop.tui.palette import Palette
from gputop.tui.titles import set_border_title


class FleetScreen(Screen[None]):
    """The runs one Prometheus server knows; the app's ``r`` reads it now (``read``)."""

    def __init__(
        self,
        prometheus: Prometheus,
        *,
        run: str | None = None,
        interval_s: float | None = None,
        runs: Sequence[FleetRun] | None = None,
        scraping: Scraping | None = None,
    ) -> None:
        """Build the screen.

        Args:
            prometheus: The server to read.
            run: Only this run (``--job``).
            interval_s: Read every this many seconds (``--interval``); None: at Prometheus's scrape interval.
            runs: What a first read already gave (the CLI reads once before, for its one-line errors).
            scraping: What a first read of the scrape interval gave; None: the first refresh asks.
        """
        super().__init__()
        self.prometheus = prometheus
        self.only_run = run
        self.interval_flag_s = interval_s
        self.scraping = scraping
        self.runs: tuple[FleetRun, ...] = tuple(runs or ())
        self.read_t: float | None = None if runs is None else time.monotonic()  # the last good read
        self.failure: str | None = None  # the last read's one line, None when it worked
        self._timer: Timer | None = None

    def compose(self) -> ComposeResult:
        # Kept as attributes: the tables are redrawn while the node screen is on top, and drawing queries nothing.
        self.header = Static(id="fleet-header")
        self.status = Static(id="fleet-status")
        self.runs_box = Vertical(id="runs-box")
        self.runs_table: DataTable[object] = DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        self.slowest_box = Vertical(id="slowest-box")
        self.slowest_table: DataTable[object] = DataTable(id="slowest", cursor_type="row")
        self.alerts_box = Vertical(id="alerts-box")
        self.alerts_table: DataTable[object] = DataTable(id="alerts", cursor_type="row")
        self.run_na = Static(id="run-na")
        yield self.header
        yield self.status
        with self.runs_box:
            yield self.runs_table
        with Horizontal(id="run-box"):
            with self.slowest_box:
                yield self.slowest_table
            with self.alerts_box:
                yield self.alerts_table
        yield self.run_na
        yield Footer()

    def on_mount(self) -> None:
        self.runs_table.add_columns(*RUN_COLUMNS)
        self.slowest_table.add_columns(*SLOW_COLUMNS)
        self.alerts_table.add_columns(*ALERT_COLUMNS)
        self.runs_table.focus()
        self.set_interval(1.0, self._show_status)
        if self.runs:
            self._show_runs(self.runs)
            self._schedule()
        else:
            self._show_status()
            self.read()

    # -- reading -------------------------------------------------------------------

    @property
    def interval_s(self) -> float:
        """Seconds between reads: ``--interval``, else Prometheus's scrape interval, else the default."""
        if self.interval_flag_s is not None:
            return self.interval_flag_s
        return self.scraping.interval_s if self.scraping is not None else DEFAULT_INTERVAL_S

    @work(thread=True, exclusive=True, exit_on_error=False, group="fleet")
    def read(self) -> None:
        """Read Prometheus off the UI thread (and its scrape interval, until it is known); answer by message."""
        scraping = self.scraping
        if scraping is None or not scraping.known:
            scraping = read_scraping(self.prometheus)
        try:
            runs = read_fleet(self.prometheus, self.only_run)
        except FleetError as exc:
            self.post_message(FleetFailed(str(exc), scraping))
            return
        self.post_message(FleetRead(tuple(runs), scraping, time.monotonic()))

    def _schedule(self) -> None:
        """The next read, one interval after this answer."""
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_timer(self.interval_s, self.read)

    def on_fleet_read(self, message: FleetRead) -> None:
        self.read_t, self.failure = message.read_t, None
        self.scraping = message.scraping or self.scraping
        self._show_runs(message.runs)
        self._schedule()

    def on_fleet_failed(self, message: FleetFailed) -> None:
        self.failure = message.reason
        self.scraping = message.scraping or self.scraping
        self._show_status()
        self._schedule()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A read that raised what no read should (a bug, or an answer cut short) is said, and reading goes on."""
        if event.worker.group == "fleet" and event.state == WorkerState.ERROR:
            self.post_message(FleetFailed(f"reading Prometheus failed: {event.worker.error!r}", None))

    # -- drawing -------------------------------------------------------------------

    @property
    def highlighted(self) -> FleetRun | None:
        """The run under the runs table's cursor."""
        row = self.runs_table.cursor_row
        return self.runs[row] if 0 <= row < len(self.runs) and self.runs_table.row_count else None

    def _show_runs(self, runs: tuple[FleetRun, ...]) -> None:
        """These runs in the table, its cursor kept on the run it was on; then that run's ranks and alerts."""
        table = self.runs_table
        was = self.highlighted
        self.runs = runs
        names = [run.run for run in runs]
        palette = Palette.from_app(self.app)
        with self.app.batch_update():
            table.clear()
            for run in self.runs:
                table.add_row(*run_cells(run, palette))
            if was is not None and was.run in names:
                table.move_cursor(row=names.index(was.run))
        self._show_run()
        self._show_status()

    def _show_run(self) -> None:
        """The highlighted run's slowest ranks and alerts, and why its N/As are N/A."""
        run, palette = self.highlighted, Palette.from_app(self.app)
        slow = [slow_cells(s, palette, run.last_in(s.rank, s.hostname)) for s in run.slowest] if run else []
        for table, rows in (
            (self.slowest_table, slow),
            (self.alerts_table, [alert_cells(a, palette) for a in run.alerts] if run else []),
        ):
            cursor = table.cursor_row
            table.clear()
            for cells in rows:
                table.add_row(*cells)
            table.move_cursor(row=min(cursor, len(rows) - 1) if rows else 0)
        name = run.run if run else ""
        unscored = ""
        if run and not run.slowest:
            unscored = " · none scored: " + (
                "no rank stepped lately" if stopped(run) else "it needs each rank's exposed comm"
            )
        set_border_title(self.slowest_box, f"slowest ranks of {name}{unscored} · enter: its node, live")
        set_border_title(self.alerts_box, f"alerts on {name} ({len(run.alerts) if run else 0})")
        reasons = list(missing_reasons(run).values()) if run else []
        self.run_na.display = bool(reasons)
        self.run_na.update(Content("\n").join([Content.styled(f"N/A {why}", "$text-muted") for why in reasons]))

    def _show_status(self) -> None:
        """The header, and the status line: how old the runs are, or what failed (the runs then marked stale)."""
        self.header.update(self._header_line())
        age = None if self.read_t is None else time.monotonic() - self.read_t
        stale = self.failure is not None and age is not None
        title = f"runs ({len(self.runs)})" + (f" · stale: read {age:.0f} s ago" if stale and age is not None else "")
        set_border_title(self.runs_box, title)
        self.runs_box.set_class(stale, "-stale")
        self.status.set_class(self.failure is not None, "-failed")
        if self.failure is not None:
            shown = "nothing read yet" if age is None else f"showing what was read {age:.0f} s ago (stale)"
            self.status.update(Content.assemble((self.failure, "bold $error"), ("  ·  ", "$text-muted"), shown))
        else:
            said = "reading…" if age is None else f"read {age:.0f} s ago"
            self.status.update(Content.styled(said, "$text-muted"))

    def _header_line(self) -> Content:
        """What is read, how many runs (how many firing), how often it is read and why that often."""
        n = len(self.runs)
        firing = sum(any(a.state == "firing" for a in run.alerts) for run in self.runs)
        every = "--interval" if self.interval_flag_s is not None else self._interval_said()
        return Content.assemble(
            ("gputop fleet", "bold"), "  ", (self.prometheus.url, "$accent"),
            f"  ·  run {self.only_run}" if self.only_run else f"  ·  {n} run{'s' * (n != 1)}",
            (f", {firing} firing" if firing else "", "bold $error"),
            (f"  ·  read every {self.interval_s:g} s: {every}", "$text-muted"),
        )  # fmt: skip

    def _interval_said(self) -> str:
        if self.scraping is None:
            return "until Prometheus says its scrape interval"
        return self.scraping.said

    # -- keys ------------------------------------------------------------------------

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table is self.runs_table:
            self._show_run()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter: on a run, go to its slowest ranks; on a slow rank or an alert naming a rank, open its node."""
        run = self.highlighted
        if run is None:
            return
        row = event.cursor_row
        if event.data_table is self.runs_table:
            self.slowest_table.focus()
        elif event.data_table is self.slowest_table and 0 <= row < len(run.slowest):
            slow = run.slowest[row]
            self.open_node(slow.instance, (run.run, slow.rank), f"rank {slow.rank}")
        elif event.data_table is self.alerts_table and 0 <= row < len(run.alerts):
            self._open_alert(run, run.alerts[row])

    def _open_alert(self, run: FleetRun, alert: FiringAlert) -> None:
        if not alert.rank:
            self.notify(f"{alert.name} is about run {run.run} as a whole: no one node to open", timeout=6)
            return
        same = (s.instance for s in run.slowest if (s.rank, s.hostname) == (alert.rank, alert.hostname))
        self.open_node(alert.instance or next(same, ""), (run.run, alert.rank), f"rank {alert.rank}")

    def open_node(self, instance: str, rank: tuple[str, str], what: str) -> None:
        """Open the node screen on the exporter ``instance``, the cursor on ``rank``."""
        if not instance:
            self.notify(f"Prometheus gave no instance label for {what}: its exporter is unknown", timeout=6)
            return
        urls = self.scraping.metrics_urls if self.scraping is not None else {}
        self.app.push_screen(FleetNodeScreen(instance=instance, url=metrics_url(instance, urls), rank=rank))
