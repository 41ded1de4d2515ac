"""The live chain, once: a snapshot in; figures, findings, what the ranks are told and the alerts out.

The dashboard, ``gputop record --on-finding`` and the Prometheus exporter read
a live source again and again, and each turned a snapshot into figures
(``summarize``, sliding each rank's span along), findings (the persistent
``Diagnoser``), the briefs each run's ranks are told (``FindingsToRanks``)
and alerts (``AlertTracker``).  With an ``AutoCapture`` it also says which
culprit ranks to profile now and puts their profiles on the findings.  Written three times, the three had drifted
(only the dashboard ordered the findings, only it survived a rule's bug);
each now holds a ``RefreshPipeline`` and does with its output what is its own:
the dashboard draws and rings, the recorder runs the user's command, the
exporter serves families.

Pure like the rest of the diagnosis: no source, no clock, no I/O.  The caller
hands the snapshot in and carries the briefs and the capture requests to its
source (never waiting for a capture: its result comes back in a later snapshot).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gputop.diagnose.alerts import Alert, AlertTracker, FindingsToRanks
from gputop.diagnose.autocapture import AutoCapture
from gputop.diagnose.findings import Finding
from gputop.model.figures import SPAN_S, Figures, summarize
from gputop.model.snapshot import Snapshot
from gputop.model.span import SpanFigures
from gputop.protocol import CaptureRequest, FindingBrief


class DiagnoserLike(Protocol):
    """What the pipeline asks of its diagnoser: a refresh's figures in, the findings to show out.

    ``Diagnoser`` (the persistent rules); a test's stand-in returns findings it was given.
    """

    def update(self, figures: Figures) -> Sequence[Finding]: ...


@dataclass(frozen=True)
class Refresh:
    """One refresh's result."""

    figures: Figures
    findings: list[Finding]  # as shown: worst first
    diagnosis: str  # "ok"; "off" without a diagnoser; "failed: ..." when a rule raised (no findings then)
    to_ranks: dict[str, tuple[FindingBrief, ...]] = field(default_factory=dict)  # run id -> its changed briefs
    alerts: list[Alert] = field(default_factory=list)
    captures: list[CaptureRequest] = field(default_factory=list)  # culprit ranks to profile now


class RefreshPipeline:
    """Snapshot to figures, findings, briefs and alerts, with the state a live view keeps between refreshes.

    One thread calls ``update``: the span figures, the diagnoser's persistence,
    the briefs already sent and the alert states are that thread's.
    """

    def __init__(
        self,
        *,
        diagnoser: DiagnoserLike | None = None,
        alerts: AlertTracker | None = None,
        auto_capture: AutoCapture | None = None,
        span_s: float = SPAN_S,
    ) -> None:
        """``diagnoser``: None diagnoses nothing ("off"); ``alerts``: None raises no alert; ``auto_capture``:
        None profiles no rank by itself (it needs ``alerts``: a finding is profiled once it has held as long
        as an alert waits)."""
        self.diagnoser = diagnoser
        self.alerts = alerts
        self.auto_capture = auto_capture
        self._spans = SpanFigures(span_s)
        self._to_ranks = FindingsToRanks()

    def update(self, snapshot: Snapshot, *, between: Callable[[], None] | None = None) -> Refresh:
        """The refresh for ``snapshot``; ``between`` is called between ranks and steps (the dashboard yields there)."""
        figures = summarize(snapshot, between_ranks=between, spans=self._spans)
        if between is not None:
            between()
        if self.diagnoser is None:
            return Refresh(figures, [], "off")
        try:
            findings = list(self.diagnoser.update(figures))
        except Exception as exc:  # a rule's bug must not take the dashboard, the recorder or the exporter down
            return Refresh(figures, [], f"failed: {type(exc).__name__}: {exc}")
        findings.sort(key=lambda f: -f.severity_rank)  # stable: the diagnoser's order within a severity
        captured: list[Finding] = []
        if self.auto_capture is not None:
            findings, captured = self.auto_capture.attach(findings, figures)
        if self.alerts is None:
            return Refresh(figures, findings, "ok", self._to_ranks.changed(findings))
        alerts = self.alerts.update(findings, figures.t)
        requests: list[CaptureRequest] = []
        if self.auto_capture is not None:
            held = self.alerts.held(figures.t)
            requests = self.auto_capture.due(held, figures, figures.t)
            held_s = {f.key: s for f, s in held}
            # Only a finding that alerts (warn, critical) is paged again with its profile.
            alerts += [Alert("captured", f, figures.t, held_s[f.key]) for f in captured if f.key in held_s]
        return Refresh(figures, findings, "ok", self._to_ranks.changed(findings), alerts, requests)
