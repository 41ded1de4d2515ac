"""The dashboard app and ``run_dashboard``, the entry point the CLI calls: its life, its data, its keys.

Data flow: the figures thread (``FiguresWorker``) turns a snapshot into a
``DashboardView`` every ``refresh_s`` and the app posts it to itself as a
``SnapshotReady`` message; the UI thread only copies the view into widgets
(``MainScreen``, and a rank's detail screen on top), and says the rest of the
refresh's news (``news``: rings the alerts, tells the ranks what the worker
decided and asks culprit ranks for the profiles it decided on, never waiting:
the answer comes back in a later snapshot, a refusal through the future's
callback).  Time travel's views are ``Past``'s.  So the UI never waits on the
collector's lock, and redraws at most once per ``refresh_s`` however fast data
arrives.  What each key does is here too, beside the bindings; what a click on
the table does is the main screen's.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from typing import ClassVar

from textual import events
from textual.binding import Binding, BindingType
from textual.reactive import reactive

from gputop.diagnose.alerts import AlertTracker
from gputop.diagnose.autocapture import AutoCapture
from gputop.diagnose.pipeline import DiagnoserLike, RefreshPipeline
from gputop.model.source import SnapshotSource, TalksToRanks
from gputop.tui.figures_worker import Failed, FiguresWorker, Refreshed
from gputop.tui.main_screen import SHORT_HEIGHT, MainScreen
from gputop.tui.messages import SnapshotReady, SourceFailed
from gputop.tui.news import News
from gputop.tui.screens.detail import RankDetailScreen
from gputop.tui.screens.help import HELP
from gputop.tui.shell import Shell, run_in_terminal
from gputop.tui.time_travel import Past
from gputop.tui.view import DashboardView

DiagnoserFactory = Callable[[], DiagnoserLike]


class GputopApp(Shell):
    """The live dashboard over one SnapshotSource.  The caller starts and stops the source.

    Its keys are the app's, not the main screen's, so they work (and the footer shows them) on a rank's detail too.
    """

    TITLE = "gputop"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (150, "-wide")]  # noqa: RUF012 - Textual's own declaration
    VERTICAL_BREAKPOINTS = [(0, "-short"), (SHORT_HEIGHT, "-tall")]  # noqa: RUF012
    BINDINGS: ClassVar[list[BindingType]] = [  # after the shell's q, ctrl+c and ?
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
        super().__init__(help_text=HELP, theme=theme)
        self.source = source
        self.refresh_s = refresh_s
        self.notice = notice
        # Snapshot to figures, findings, briefs for the ranks and alerts, on the figures thread.
        profiles = auto_capture and alerts is not None and isinstance(source, TalksToRanks)
        pipeline = RefreshPipeline(
            diagnoser=diagnoser_factory() if diagnoser_factory is not None else None,
            alerts=alerts,
            auto_capture=AutoCapture() if profiles else None,
        )
        self.worker = FiguresWorker(source, pipeline, refresh_s, self._post_refresh)
        self.main = MainScreen(self.worker, source_text=source.description, price_per_hour=price_per_hour)
        self._newest: DashboardView | None = None  # what arrived, shown on resume when paused
        self.past = Past()  # the views to step back through, and which one is shown
        self.news = News(self, source)  # the bell, notifications, and what the ranks are told

    def get_default_screen(self) -> MainScreen:
        return self.main

    @property
    def view(self) -> DashboardView | None:
        """The view on screen: the newest, or the one a pause or time travel holds."""
        return self.main.view

    def on_mount(self) -> None:
        if self.notice:
            self.notify(self.notice, timeout=15)
        # Its views are drawn on the main screen, whose own mount comes after the app's: start once that is done.
        self.main.call_later(self.worker.start)
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
    def figures_every_s(self) -> float:
        """How often figures are really updated: every refresh, or less often when one costs more."""
        return self.worker.every_s

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key | events.MouseDown | events.MouseScrollDown | events.MouseScrollUp):
            self.worker.input_t = time.monotonic()
        await super().on_event(event)

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        if not self.main.table.is_attached:  # a message that arrives while the app shuts down
            return
        self._newest = message.view
        self.past.remember(message.view, paused=self.paused)
        news = self.news
        news.rejections(message.view.snapshot.rejected)
        alerts, briefs = self.worker.take_pending()
        news.ring_alerts(alerts)
        news.tell_ranks(briefs)
        news.ask_for_profiles(self.worker.take_captures())
        header = self.main.header
        header.finished = message.finished
        slow = self.figures_every_s > 1.5 * self.refresh_s
        # Rounded as shown, so that a change too small to read does not repaint the header.
        header.figures_every_s = float(f"{self.figures_every_s:.2g}") if slow else None
        if not self.paused:
            self._show(message.view)

    def on_source_failed(self, message: SourceFailed) -> None:
        self.news.source_failed(message.reason)

    def _show(self, view: DashboardView) -> None:
        """Draw ``view`` on the main screen, and on the rank's detail when one is on top."""
        self.main.show(view)
        if isinstance(self.screen, RankDetailScreen):
            self.screen.show(view)

    # -- keys: what the main screen does, on any screen ------------------------------

    def action_open_rank(self) -> None:
        """Open the selected rank's detail screen."""
        self.main.open_rank()

    def action_fold_all(self) -> None:
        self.main.fold_all()

    def action_sort(self) -> None:
        self.main.cycle_sort()

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
        self.main.header.behind_s = self.past.behind_s
        self._show(self.past.shown)

    def action_pause(self) -> None:
        self.paused = not self.paused

    def watch_paused(self, paused: bool) -> None:
        header = self.main.header
        header.paused = paused
        if not paused:
            self.past.go_live()
            header.behind_s = 0.0
            if self._newest is not None and self._newest is not self.view:
                self._show(self._newest)


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
    code = run_in_terminal(app)
    if remember_theme is not None:
        remember_theme(app.theme)
    return code
