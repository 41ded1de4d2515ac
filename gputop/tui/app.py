"""The dashboard app and ``run_dashboard``, the entry point the CLI calls.

Data flow: the figures thread (``FiguresWorker``) turns a snapshot into a
``DashboardView`` every ``refresh_s`` and the app posts it to itself as a
``SnapshotReady`` message; the UI thread only copies the view into widgets,
rings the alerts, tells the ranks what the worker decided and asks culprit
ranks for the profiles it decided on (never waiting: the answer comes back in a
later snapshot, a refusal through the future's callback).  Time travel's
views are ``Past``'s.  So the UI never waits on the collector's lock, and
redraws at most once per ``refresh_s`` however fast data arrives.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import gc
import signal
import sys
import time
from collections.abc import Callable
from typing import ClassVar

from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.css.scalar import Scalar
from textual.notifications import SeverityLevel
from textual.reactive import reactive
from textual.widgets import Footer

from gputop.diagnose import Diagnoser
from gputop.diagnose.alerts import Alert, AlertTracker
from gputop.diagnose.autocapture import AutoCapture
from gputop.diagnose.live import LivePipeline
from gputop.model.source import SnapshotSource, TalksToRanks
from gputop.protocol import CaptureRequest, CaptureResult, FindingBrief
from gputop.tui.figures_worker import Failed, FiguresWorker, Refreshed
from gputop.tui.messages import RowHighlighted, RowSelected, SnapshotReady, SourceFailed, TerminalGone
from gputop.tui.palette import Palette
from gputop.tui.screens.detail import RankDetailScreen
from gputop.tui.screens.help import HelpScreen
from gputop.tui.terminal import exit_when_the_terminal_goes
from gputop.tui.time_travel import Past
from gputop.tui.titles import set_border_title
from gputop.tui.view import DashboardView
from gputop.tui.widgets.empty_state import EmptyState
from gputop.tui.widgets.findings import FindingsPanel
from gputop.tui.widgets.gpu_panel import GpuPanel
from gputop.tui.widgets.header import HeaderBar
from gputop.tui.widgets.history import HistoryPanel
from gputop.tui.widgets.phase_bar import phase_legend
from gputop.tui.widgets.rank_cells import evidence_highlight
from gputop.tui.widgets.ranks_table import RanksTable
from gputop.tui.widgets.run_chart import RunChart

SHORT_HEIGHT = 32  # below this many lines: GPUs packed, findings brief, sparklines only in the detail screen

DiagnoserFactory = Callable[[], Diagnoser]


class GputopApp(App[int]):
    """The live dashboard over one SnapshotSource.  The caller starts and stops the source."""

    CSS_PATH = "gputop.tcss"
    TITLE = "gputop"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (150, "-wide")]  # noqa: RUF012 - Textual's own declaration
    VERTICAL_BREAKPOINTS = [(0, "-short"), (SHORT_HEIGHT, "-tall")]  # noqa: RUF012
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        # Beside a training job in a terminal, Ctrl-C means "stop", as in nvitop and top.
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("p", "pause", "Pause"),
        Binding("left_square_bracket", "travel_back", "Back", key_display="["),
        Binding("right_square_bracket", "travel_forward", "Fwd", key_display="]"),
        Binding("s", "sort", "Sort"),
        Binding("f", "fold_all", "Fold hosts", show=False),
        Binding("enter", "open_rank", "Detail", show=False),
    ]

    paused: reactive[bool] = reactive(False)
    """The view is frozen; snapshots keep being taken and the newest is shown on resume."""

    freeze_startup_objects = False
    """Once the screen is up, hide every object made so far from the garbage collector (``run_dashboard``
    sets it: the process is the dashboard's alone).

    The ~60,000 objects of the modules, Textual's stylesheet and the widgets live as long as the
    dashboard, and each full collection walked them all: ~50 ms every half minute, a sixth of a
    2-rank dashboard's CPU.  Frozen, they are still freed by their reference counts; only a cycle
    among them that became garbage later would stay (the screen's widgets never do).
    """

    leave_on_sigterm = False
    """SIGTERM closes the app as ``q`` would, restoring the terminal (``run_dashboard`` sets it).

    Python's default is to die on the spot: the screen stayed drawn, the terminal kept
    reporting the mouse, and ``gputop demo`` skipped stopping its job in order.
    Off under the test pilot, whose process is pytest's.
    """

    def __init__(
        self,
        source: SnapshotSource,
        refresh_s: float = 0.5,
        *,
        diagnoser_factory: DiagnoserFactory | None = None,
        theme: str | None = None,
        alerts: AlertTracker | None = None,
        notice: str | None = None,
        price_per_hour: float | None = None,
        auto_capture: bool = False,
    ) -> None:
        """Build the app.

        Args:
            source: Where snapshots come from (already started, or a FixedSource).
            refresh_s: Seconds between snapshots, and so between redraws.
            diagnoser_factory: Makes the stateful diagnoser; None shows "no rules active".
            theme: A Textual theme name; None keeps Textual's default.
            alerts: Decides which findings ring the bell; None rings nothing.
            notice: Said once at start, as a notification (the demo says what it runs where).
            price_per_hour: A GPU-hour's price: the findings' waste is shown in money too.
            auto_capture: Profile a straggler's or stall's culprit rank once its finding has held as long
                as an alert waits (a live source with ``alerts`` only).
        """
        super().__init__()
        if theme is not None:
            self.theme = theme
        self.source = source
        self.refresh_s = refresh_s
        self.notice = notice
        self.price_per_hour = price_per_hour
        # Snapshot to figures, findings, briefs for the ranks and alerts, on the figures thread.
        profiles = auto_capture and alerts is not None and isinstance(source, TalksToRanks)
        pipeline = LivePipeline(
            diagnoser=diagnoser_factory() if diagnoser_factory is not None else None,
            alerts=alerts,
            auto_capture=AutoCapture() if profiles else None,
        )
        self.worker = FiguresWorker(source, pipeline, refresh_s, self._post_refresh)
        self.view: DashboardView | None = None  # what is on screen
        self._newest: DashboardView | None = None  # what arrived, shown on resume when paused
        self.past = Past()  # the views to step back through, and which one is shown
        self._last_failure = ""
        self._rejections_seen: set[str] = set()

    def compose(self) -> ComposeResult:
        # Kept as attributes: while a detail screen is on top, app.query_one() would search that screen.
        self.header = HeaderBar(source_text=self.source.description, id="header")
        self.gpus = GpuPanel(id="gpus")
        self.empty = EmptyState(id="empty")
        self.ranks_box = Vertical(id="ranks-box")
        self.table = RanksTable(id="ranks")
        self.findings_box = VerticalScroll(id="findings-box")
        self.findings = FindingsPanel(id="findings", price_per_hour=self.price_per_hour)
        self.history = HistoryPanel(id="history")
        self.chart = RunChart(id="run-chart")
        self.chart.border_title = "run"
        self.gpus.border_title = "GPUs"
        self.ranks_box.border_title = "ranks"
        self.findings_box.border_title = "findings"
        self.history.border_title = "history"
        self.empty.border_title = "waiting for a run"
        self.empty.source_text = self.source.description
        self.findings.diagnosis = "off" if self.worker.pipeline.diagnoser is None else "waiting"
        yield self.header
        yield self.gpus
        yield self.empty
        self.middle = Horizontal(id="middle")
        with self.middle:
            with self.ranks_box:
                yield self.table
            with self.findings_box:
                yield self.findings
        yield self.chart
        yield self.history
        yield Footer()

    def on_mount(self) -> None:
        self.screen.set_class(True, "-empty")
        self.table.focus()
        if self.notice:
            self.notify(self.notice, timeout=15)
        self.worker.start()
        if self.leave_on_sigterm:  # through the event loop: a plain signal handler could cut into its queues
            leave = functools.partial(self.exit, return_code=128 + signal.SIGTERM)  # as a SIGTERM death would say
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, leave)
        if self.freeze_startup_objects:
            self.call_after_refresh(self._freeze_startup_objects)

    @staticmethod
    def _freeze_startup_objects() -> None:
        gc.collect()  # what is garbage now goes now, not frozen with the rest
        gc.freeze()

    def on_unmount(self) -> None:
        self.worker.stop()

    # -- data ------------------------------------------------------------------

    def _post_refresh(self, result: Refreshed | Failed) -> None:
        """On the figures thread: hand its result to the UI thread as a message."""
        if isinstance(result, Refreshed):
            self.post_message(SnapshotReady(result.view, finished=result.finished))
        else:
            self.post_message(SourceFailed(result.reason))

    @property
    def _selected(self) -> str | None:
        """The rank the table's cursor is on (a "run:rank" key): its history is drawn, so snapshots carry it."""
        return self.worker.selected

    @_selected.setter
    def _selected(self, key: str | None) -> None:
        self.worker.selected = key

    @property
    def figures_every_s(self) -> float:
        """How often figures are really updated: every refresh, or less often when one costs more."""
        return self.worker.every_s

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key | events.MouseDown | events.MouseScrollDown | events.MouseScrollUp):
            self.worker.input_t = time.monotonic()
        await super().on_event(event)

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        if not self.table.is_attached:  # a message that arrives while the app shuts down
            return
        self._newest = message.view
        self.past.remember(message.view, paused=self.paused)
        self._announce_rejections(message.view.snapshot.rejected)
        alerts, briefs = self.worker.take_pending()
        self._ring_alerts(alerts)
        self._tell_ranks(briefs)
        self._ask_for_profiles(self.worker.take_captures())
        self.header.finished = message.finished
        slow = self.figures_every_s > 1.5 * self.refresh_s
        # Rounded as shown, so that a change too small to read does not repaint the header.
        self.header.figures_every_s = float(f"{self.figures_every_s:.2g}") if slow else None
        if not self.paused:
            self._show(message.view)

    def _announce_rejections(self, rejected: tuple[str, ...]) -> None:
        """A connection closed for a bad frame: say so once, also while runs are showing."""
        fresh = [reason for reason in rejected if reason not in self._rejections_seen]
        for reason in fresh[-3:]:
            self.notify(reason, title="connection refused", severity="warning", timeout=8)
        self._rejections_seen = set(rejected)

    def _ring_alerts(self, alerts: list[Alert]) -> None:
        """A warn/critical finding that has held long enough: the terminal bell and a notification."""
        for alert in alerts:
            finding = alert.finding
            if alert.kind == "cleared":
                self.notify(finding.title, title=f"cleared: {finding.cause}", timeout=8)
                continue
            if alert.kind == "captured":  # news about a finding that already rang: no bell
                text = finding.capture.text() if finding.capture is not None else finding.title
                self.notify(text, title=f"profiled: {finding.cause}", timeout=15)
                continue
            self.bell()
            severity: SeverityLevel = "error" if finding.severity == "critical" else "warning"
            title = f"{finding.severity}: {finding.cause}" + (" (worse)" if alert.kind == "worsened" else "")
            self.notify(f"{finding.title}\n{finding.suggestion}", title=title, severity=severity, timeout=15)

    def _tell_ranks(self, changed: dict[str, tuple[FindingBrief, ...]]) -> None:
        """A live source passes changed findings down to their run's ranks, for the trainer's logger."""
        if isinstance(self.source, TalksToRanks):
            for run_id, briefs in changed.items():
                self.source.notify_findings(run_id, briefs)

    def _ask_for_profiles(self, requests: list[CaptureRequest]) -> None:
        """The culprit ranks the pipeline wants profiled: asked without waiting; a refusal is a notification.

        The result itself comes back in a later snapshot, where the pipeline puts it on its finding.
        """
        if not isinstance(self.source, TalksToRanks):
            return
        for request in requests:
            future = self.source.request_capture(request)
            future.add_done_callback(functools.partial(_on_profile_answered, self, request))

    def on_source_failed(self, message: SourceFailed) -> None:
        if message.reason != self._last_failure:
            self._last_failure = message.reason
            self.notify(message.reason, title="reading data failed", severity="error", timeout=10)

    # -- drawing ---------------------------------------------------------------

    def _show(self, view: DashboardView) -> None:
        self.view = view
        snapshot = view.snapshot
        self.header.show(view)
        self.table.screen.set_class(view.empty, "-empty")

        gpus = self.gpus
        gpus.compact = self.size.height < SHORT_HEIGHT
        gpus.rows = view.gpu_rows
        gpus.unavailable = view.gpu_unavailable
        gpus.waiting = snapshot.gpu is None
        gpus.tooltip = self._gpu_tooltip(view)

        if view.empty:
            empty = self.empty
            empty.listen = snapshot.listen
            empty.rejected = snapshot.rejected
        else:
            table = self.table
            palette = Palette.from_app(self)
            top = view.findings[0] if view.findings else None
            table.show(view.rank_rows, palette, view.host_rows, evidence_highlight(top, view.rank_rows, palette))
            self._title_ranks(table)
            findings = self.findings
            findings.findings = view.findings
            findings.diagnosis = view.diagnosis
            findings.cpu_sharing = view.cpu_sharing
            findings.brief = self.size.height < SHORT_HEIGHT
            box = self.findings_box
            worst = view.findings[0].severity if view.findings else ""
            box.set_class(worst == "critical", "-critical")
            box.set_class(worst == "warn", "-warn")
            set_border_title(box, f"findings ({len(view.findings)})" if view.findings else "findings")
            if self._selected is None or view.row(self._selected) is None:
                cursor = table.selected_key
                self._selected = cursor if cursor is not None and not cursor.startswith("host:") else None
            self._show_history()
            self._show_chart()

        if isinstance(self.screen, RankDetailScreen):
            self.screen.show(view)

    def middle_lines(self) -> int:
        """The lines the table and the findings need: the middle's height at most.

        From their content, not from the layout's result, which the middle's own
        height constrains.
        """
        table_lines = self.table.virtual_size.height + self.ranks_box.styles.gutter.height  # header + rows + border
        findings = self.findings
        width = findings.size.width
        box = self.findings_box
        findings_lines = box.styles.gutter.height + (
            findings.get_content_height(findings.size, findings.size, width) if width else 0
        )
        cap = box.styles.max_height
        if cap is not None and cap.is_cells:
            findings_lines = min(findings_lines, int(cap.value))
        if self.table.screen.has_class("-narrow"):  # the main screen, also under a detail screen
            return table_lines + findings_lines
        return max(table_lines, findings_lines)

    @property
    def middle_fitted(self) -> bool:
        """Whether the middle's height is what its content needs (tests wait for it before a snapshot)."""
        return self.middle.styles.max_height == Scalar.from_number(self.middle_lines())

    def _fit_middle(self) -> None:
        """The table and findings no taller than their lines, so the run chart gets what they leave.

        Both the middle and the chart are fractions of the height; the middle's
        maximum is what its content needs (the table scrolls within it when
        that is more than the screen has), and Textual gives the rest to the chart.
        """
        if not self.middle_fitted:
            self.middle.styles.max_height = self.middle_lines()

    def _title_ranks(self, table: RanksTable) -> None:
        view = self.view
        n = len(view.rank_rows) if view else 0
        title = f"ranks ({n}) · sort: {table.sort_key.name}"
        if view and view.grouped:
            title += f" · {view.hosts} hosts{' folded' if table.all_folded else ''}"
        if view and any(r.slowest for r in view.rank_rows):
            title += " · ▲ slowest"
        # The phase bars' legend rides on the title, where the eye starts reading the table.
        shown = {phase for row in view.rank_rows for phase, _ in row.phases} if view else set()
        set_border_title(self.ranks_box, Content.assemble(title, "  ", phase_legend(Palette.from_app(self), shown)))
        self.call_after_refresh(self._fit_middle)  # rows shown, folded or opened: the table's height follows

    def _show_chart(self) -> None:
        """The run of the selected rank (else the first run): step time, samples/s, and every GPU."""
        view = self.view
        if view is None or not view.snapshot.runs:
            return
        runs = view.snapshot.runs
        run_id = self._selected.rsplit(":", 1)[0] if self._selected else runs[0].run_id
        run = next((r for r in runs if r.run_id == run_id), runs[0])
        chart = self.chart
        # The GPUs of the selected rank's host (its node sampler's), else this machine's.
        rank = view.rank(self._selected) if self._selected else None
        host = (rank or run.ranks[0]).hello.hostname if (rank or run.ranks) else ""
        chart.show(
            history=run.history,
            gpu_history=view.snapshot.gpu_history_of(host),
            show_gpus=self.size.height >= SHORT_HEIGHT,
        )
        on = f" · GPUs of {host}" if host in view.snapshot.node_gpu_history else ""
        set_border_title(chart, f"run {run.name or run.run_id} · per second, newest right{on}")

    def _show_history(self) -> None:
        view, key = self.view, self._selected
        history = self.history
        row = view.row(key) if (view is not None and key is not None) else None
        if view is None or key is None or row is None:
            history.series = None
            set_border_title(history, "history")
            return
        history.series = view.series(key)
        where = f" · GPU {row.gpu}" if row.gpu not in ("-", "cpu") else ""
        set_border_title(history, f"history · {row.run_name} rank {row.rank}{where}")

    @staticmethod
    def _gpu_tooltip(view: DashboardView) -> str | None:
        lines = []
        for row in view.gpu_rows:
            g = row.reading
            gpu = f"{row.hostname} GPU {g.index}" if row.hostname else f"GPU {g.index}"
            lines += [f"{gpu} {name}: N/A, {why}" for name, why in g.na.items()]
            lines += [
                f"{gpu}: pid {p.pid} {p.name or ''} is not a reporting rank".replace("  ", " ") for p in row.unobserved
            ]
        return "\n".join(lines) or None

    # -- events and actions -----------------------------------------------------

    def on_row_highlighted(self, event: RowHighlighted) -> None:
        key = event.key
        if key != self._selected and not key.startswith("host:"):
            self._selected = key
            self._show_history()

    def on_row_selected(self, event: RowSelected) -> None:
        """Enter or a click: a rank opens its detail, a host folds or unfolds."""
        key = event.key
        if key.startswith("host:"):
            self.table.toggle_fold(key)
            self._title_ranks(self.table)
            return
        self._selected = key
        self.action_open_rank()

    def on_findings_resized(self) -> None:
        self.call_after_refresh(self._fit_middle)

    def on_sort_changed(self) -> None:
        self._title_ranks(self.table)

    def action_fold_all(self) -> None:
        """Fold every host, or open them all when all are folded."""
        table = self.table
        table.set_all_folded(not table.all_folded)
        self._title_ranks(table)

    def action_travel_back(self) -> None:
        """Pause and show the view one refresh earlier."""
        if self.past.step_back() is None:
            return
        if not self.paused:
            self.paused = True
        self._show_travel()

    def action_travel_forward(self) -> None:
        """One refresh later; past the newest, back to live."""
        if not self.paused:
            return
        if self.past.step_forward() is None:
            self.paused = False
            return
        self._show_travel()

    def _show_travel(self) -> None:
        self.header.behind_s = self.past.behind_s
        self._show(self.past.shown)

    def action_open_rank(self) -> None:
        """Open the selected rank's detail screen."""
        cursor = self.table.selected_key
        if cursor is not None and cursor.startswith("host:") and not isinstance(self.screen, RankDetailScreen):
            self.table.toggle_fold(cursor)
            self._title_ranks(self.table)
            return
        if self.view is None or self._selected is None or self.view.rank(self._selected) is None:
            return
        if isinstance(self.screen, RankDetailScreen):
            return
        self.push_screen(RankDetailScreen(key=self._selected, view=self.view))

    def request_exit(self) -> None:
        """Exit soon, from any thread (the terminal watch's)."""
        self.post_message(TerminalGone())

    def on_terminal_gone(self, message: TerminalGone) -> None:
        self.exit(return_code=129)  # 128 + SIGHUP: what a hangup would have made of gputop

    def action_pause(self) -> None:
        self.paused = not self.paused

    def watch_paused(self, paused: bool) -> None:
        self.header.paused = paused
        if not paused:
            self.past.go_live()
            self.header.behind_s = 0.0
            if self._newest is not None and self._newest is not self.view:
                self._show(self._newest)

    def action_sort(self) -> None:
        table = self.table
        table.action_cycle_sort()
        self._title_ranks(table)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())


def _on_profile_answered(
    app: GputopApp, request: CaptureRequest, done: concurrent.futures.Future[CaptureResult]
) -> None:
    """On the collector's thread (or at once): say on the UI thread why an automatic capture did not happen."""
    try:
        result = done.result()
    except Exception as exc:  # the relay broke: the dashboard goes on
        why = f"{type(exc).__name__}: {exc}"
    else:
        if result.ok:
            return  # the pipeline shows it on its finding, with a notification of its own
        why = result.error
    if app.is_running:
        say = functools.partial(app.notify, f"rank {request.rank}: {why}", title="automatic profile failed",
                                severity="warning", timeout=10)  # fmt: skip
        try:
            app.call_from_thread(say)
        except RuntimeError:  # already on the app's thread (an answer that was ready at once)
            say()


def run_dashboard(
    source: SnapshotSource,
    *,
    refresh_s: float = 0.5,
    diagnoser_factory: DiagnoserFactory | None = None,
    theme: str | None = None,
    remember_theme: Callable[[str], None] | None = None,
    alerts: AlertTracker | None = None,
    notice: str | None = None,
    price_per_hour: float | None = None,
    auto_capture: bool = False,
) -> int:
    """Show the dashboard over a started ``source`` until the user quits; returns the exit code.

    The caller owns the source: it starts it before (so "address in use"
    is its one-line error) and stops it after.  ``remember_theme`` gets the
    theme on screen at exit (the user may have picked one in the command palette).
    """
    app = GputopApp(
        source,
        refresh_s=refresh_s,
        diagnoser_factory=diagnoser_factory,
        theme=theme,
        alerts=alerts,
        notice=notice,
        price_per_hour=price_per_hour,
        auto_capture=auto_capture,
    )
    # The UI thread waits for the interpreter at most this long when the figures worker or the
    # collector holds it (Python's default is 5 ms, several times per frame).
    sys.setswitchinterval(0.001)
    app.freeze_startup_objects = True
    app.leave_on_sigterm = True
    exit_when_the_terminal_goes(sys.__stdout__.fileno() if sys.__stdout__ else 1, app.request_exit)
    result = app.run()
    if remember_theme is not None:
        remember_theme(app.theme)
    return result if isinstance(result, int) else (app.return_code or 0)
