"""What a refresh brings besides the view: what the user is told once, and what the ranks are told.

With each view the figures thread hands over the alerts that fired, the
findings' briefs that changed per run and the culprit ranks to profile; the
snapshot names the connections closed for a bad frame; a failed read comes as
a message of its own.  ``News`` turns them into what the user hears (the
terminal bell, a notification, each thing said once) and what a live source
passes down to its ranks (briefs for the trainer's logger, capture requests
asked without waiting: the profile itself comes back in a later snapshot, a
refusal through the request's future).  It reaches Textual only through the
app's ``notify``, ``bell`` and ``call_later``, so a test can hand it a stand-in.
"""

from __future__ import annotations

import concurrent.futures
import functools
from typing import TYPE_CHECKING

from gputop.diagnose.alerts import Alert
from gputop.model.source import SnapshotSource, TalksToRanks
from gputop.protocol import CaptureRequest, CaptureResult, FindingBrief

if TYPE_CHECKING:  # the app is handed in: this module loads no Textual
    from textual.app import App
    from textual.notifications import SeverityLevel


class News:
    """Says each refresh's news on ``app`` and passes the ranks' part to ``source`` (when it talks to ranks)."""

    def __init__(self, app: App[int], source: SnapshotSource) -> None:
        self._app = app
        self._source = source
        self._last_failure = ""
        self._rejections_seen: set[str] = set()

    def rejections(self, rejected: tuple[str, ...]) -> None:
        """A connection closed for a bad frame: say so once, also while runs are showing."""
        fresh = [reason for reason in rejected if reason not in self._rejections_seen]
        for reason in fresh[-3:]:
            self._app.notify(reason, title="connection refused", severity="warning", timeout=8)
        self._rejections_seen = set(rejected)

    def source_failed(self, reason: str) -> None:
        """Reading the source failed: said once per reason in a row."""
        if reason != self._last_failure:
            self._last_failure = reason
            self._app.notify(reason, title="reading data failed", severity="error", timeout=10)

    def ring_alerts(self, alerts: list[Alert]) -> None:
        """A warn/critical finding that has held long enough: the terminal bell and a notification."""
        app = self._app
        for alert in alerts:
            finding = alert.finding
            if alert.kind == "cleared":
                app.notify(finding.title, title=f"cleared: {finding.cause}", timeout=8)
                continue
            if alert.kind == "captured":  # news about a finding that already rang: no bell
                text = finding.capture.text() if finding.capture is not None else finding.title
                app.notify(text, title=f"profiled: {finding.cause}", timeout=15)
                continue
            app.bell()
            severity: SeverityLevel = "error" if finding.severity == "critical" else "warning"
            title = f"{finding.severity}: {finding.cause}" + (" (worse)" if alert.kind == "worsened" else "")
            app.notify(f"{finding.title}\n{finding.suggestion}", title=title, severity=severity, timeout=15)

    def tell_ranks(self, changed: dict[str, tuple[FindingBrief, ...]]) -> None:
        """A live source passes changed findings down to their run's ranks, for the trainer's logger."""
        if isinstance(self._source, TalksToRanks):
            for run_id, briefs in changed.items():
                self._source.notify_findings(run_id, briefs)

    def ask_for_profiles(self, requests: list[CaptureRequest]) -> None:
        """The culprit ranks the pipeline wants profiled: asked without waiting; a refusal is a notification.

        The result itself comes back in a later snapshot, where the pipeline puts it on its finding.
        """
        if not isinstance(self._source, TalksToRanks):
            return
        for request in requests:
            future = self._source.request_capture(request)
            future.add_done_callback(functools.partial(_on_profile_answered, self._app, request))


def _on_profile_answered(
    app: App[int], request: CaptureRequest, done: concurrent.futures.Future[CaptureResult]
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
        # call_later posts to the app's queue from any thread and returns at once; call_from_thread would
        # hold the collector's loop (and every rank's ingest) until the UI thread got round to it, and for
        # good if the app stopped meanwhile.
        app.call_later(
            app.notify, f"rank {request.rank}: {why}", title="automatic profile failed", severity="warning", timeout=10
        )
