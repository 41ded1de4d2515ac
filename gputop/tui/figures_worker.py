"""The dashboard's figures thread: a snapshot, its figures, findings and view every refresh, off the UI thread.

Every ``refresh_s`` it calls ``source.snapshot()``, runs the live chain
(``RefreshPipeline``: figures once, findings, the briefs for the ranks, alerts),
builds a ``DashboardView`` and hands it to ``post``.  So the UI never waits on
the collector's lock, and redraws at most once per ``refresh_s`` however fast
data arrives.  No Textual here: the app wraps what is posted in its messages,
and a test drives ``refresh()`` directly.

One long-lived thread, not a Textual worker per refresh: the worker machinery
(a task, a pool hand-off, three state-change messages through the DOM) cost
more than 2 ranks' figures.  It holds itself to ``FIGURES_DUTY`` of a core, and
after a key or a click pauses between ranks so the keypress does not wait
behind a thousand ranks' figures (Python runs one thread at a time).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gputop.diagnose.alerts import Alert
from gputop.diagnose.pipeline import RefreshPipeline
from gputop.model.figures import WindowFiguresMemo
from gputop.model.source import SnapshotSource
from gputop.processes.procfs import name_this_thread
from gputop.protocol import CaptureRequest, FindingBrief
from gputop.tui.view import DashboardView, build_view

# The worker spends at most this share of a core on figures and diagnosis: when
# one refresh's work takes longer than FIGURES_DUTY x refresh_s (hundreds of ranks),
# the next waits, and the header says how often figures update.
FIGURES_DUTY = 0.05
# After a key or a click, the worker pauses this long (between ranks) before going on.
INPUT_QUIET_S = 0.3


@dataclass(frozen=True)
class Refreshed:
    """A new view, and whether a replay reached the end of its recording."""

    view: DashboardView
    finished: bool = False


@dataclass(frozen=True)
class Failed:
    """The snapshot or the view built from it raised: the dashboard keeps the last view and says why."""

    reason: str


class _Stopping(Exception):
    """The worker is stopping: it leaves mid-refresh."""


class FiguresWorker:
    """Refreshes on its own thread and posts each result; the UI thread sets ``selected`` and ``input_t``."""

    def __init__(
        self,
        source: SnapshotSource,
        pipeline: RefreshPipeline,
        refresh_s: float,
        post: Callable[[Refreshed | Failed], None],
    ) -> None:
        """``post`` is called on the worker's thread; it may raise RuntimeError once its receiver is gone."""
        self.source = source
        self.pipeline = pipeline
        self.refresh_s = refresh_s
        self.post = post
        self.selected: str | None = None  # the rank whose whole history and sparklines the view carries
        self.input_t = 0.0  # monotonic: the user's last key or click
        self.every_s = refresh_s  # how often figures are really updated (longer when a refresh costs more)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gputop-figures", daemon=True)
        self._series_memo = WindowFiguresMemo()  # this thread's alone
        # Kept apart from the views, which replace each other in the app's queue: no alert or brief is lost.
        self._pending_lock = threading.Lock()
        self._pending_alerts: list[Alert] = []
        self._pending_briefs: dict[str, tuple[FindingBrief, ...]] = {}
        self._pending_captures: list[CaptureRequest] = []

    @property
    def native_id(self) -> int | None:
        return self._thread.native_id

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """At most one rank's figures away (the thread checks between ranks), or one diagnosis."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)

    def take_pending(self) -> tuple[list[Alert], dict[str, tuple[FindingBrief, ...]]]:
        """The alerts and the ranks' briefs decided since the last call (the UI thread carries them out)."""
        with self._pending_lock:
            alerts, self._pending_alerts = self._pending_alerts, []
            briefs, self._pending_briefs = self._pending_briefs, {}
        return alerts, briefs

    def take_captures(self) -> list[CaptureRequest]:
        """The culprit ranks to profile decided since the last call (the UI thread asks the source)."""
        with self._pending_lock:
            captures, self._pending_captures = self._pending_captures, []
        return captures

    def refresh(self) -> Refreshed:
        """One refresh: take a snapshot and build the view (on the worker's thread, or a test's)."""
        selected = self.selected
        self.source.focus = frozenset({selected}) if selected else frozenset()
        update = self.pipeline.update(self.source.snapshot(), between=self._wait_for_quiet)
        with self._pending_lock:
            self._pending_alerts += update.alerts
            self._pending_briefs.update(update.to_ranks)
            self._pending_captures += update.captures
        self._wait_for_quiet()
        view = build_view(update.figures, update.findings, update.diagnosis)
        if selected is not None:
            # The history panel's sparklines, computed here rather than on the UI thread, each
            # window's figures once (the memo) rather than on every refresh.
            view.series(selected, self._series_memo)
        return Refreshed(view, finished=self.source.finished)

    def _loop(self) -> None:
        name_this_thread("gputop-figures")
        next_t = time.monotonic()
        while not self._stopping.wait(max(next_t - time.monotonic(), 0.0)):
            started_t, started_cpu = time.monotonic(), time.thread_time()
            try:
                result: Refreshed | Failed = self.refresh()
            except _Stopping:
                return
            except Exception as exc:  # a broken source shows as a notice, the last view stays
                result = Failed(f"{type(exc).__name__}: {exc}")
            cost_s = time.thread_time() - started_cpu
            self.every_s = max(self.refresh_s, cost_s / FIGURES_DUTY)
            next_t = started_t + self.every_s
            if self._stopping.is_set():
                return
            try:
                self.post(result)
            except RuntimeError:  # the receiver closed under us: the app is gone
                return

    def _wait_for_quiet(self) -> None:
        """Sleep (letting the UI thread run) until INPUT_QUIET_S after the last input; leave when stopping."""
        while (wait_s := self.input_t + INPUT_QUIET_S - time.monotonic()) > 0:
            if self._stopping.wait(wait_s):
                break
        if self._stopping.is_set():
            raise _Stopping
