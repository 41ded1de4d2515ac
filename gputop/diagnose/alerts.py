"""Alerts: which shown findings deserve a bell or a page, and when.

A warn or critical finding that has held for ``hold_s`` is raised once; it is
raised again when it worsens (warn to critical) and once more when it clears.
The same finding is never alerted twice within ``min_interval_s`` unless it
clears, so a cause flapping at its threshold pages someone once, not every
minute.  Info findings never alert.  A straggler or stall finding that
alerted is told about once more when its culprit rank's profile is attached
(``captured``, ``gputop.diagnose.autocapture``).  Pure, like the rest of the diagnosis:
the findings and the time come in, the alerts go out; the dashboard rings its
bell and ``gputop record --on-finding`` runs the user's command.

The same places tell each run's ranks what they show for it
(``FindingsToRanks``), so a rank can log its run's findings beside its loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gputop.diagnose.findings import SEVERITIES, Finding, FindingKey, Severity
from gputop.protocol import MAX_FINDINGS_NOTICED, FindingBrief

HOLD_S = 30.0  # a finding must hold half a minute before it rings: the panel already shows blips
ALERT_MIN_INTERVAL_S = 300.0  # at most one raise or worsening per finding every 5 minutes
ALERT_SEVERITIES = ("warn", "critical")

# "captured": the culprit rank's profile came back and is on the finding (gputop.diagnose.autocapture).
AlertKind = Literal["raised", "worsened", "cleared", "captured"]


@dataclass(frozen=True)
class Alert:
    """One thing to tell a person about one finding."""

    kind: AlertKind
    finding: Finding  # for "cleared": the finding as last seen
    t: float  # when the alert was decided (snapshot time)
    held_s: float  # how long the finding had held by then

    def to_dict(self, price_per_hour: float | None = None) -> dict[str, Any]:
        """The JSON object an ``--on-finding`` command reads on its stdin (money where a GPU-hour has a price)."""
        finding = self.finding.to_dict(price_per_hour)
        return {"event": self.kind, "t": self.t, "held_s": round(self.held_s, 1), "finding": finding}


@dataclass
class _State:
    finding: Finding
    since_t: float
    alerted_severity: Severity | None = None  # None: not alerted yet


class AlertTracker:
    """Turns each refresh's shown findings into alerts."""

    def __init__(self, *, hold_s: float = HOLD_S, min_interval_s: float = ALERT_MIN_INTERVAL_S) -> None:
        if hold_s < 0 or min_interval_s < 0:
            raise ValueError("hold_s and min_interval_s must not be negative")
        self.hold_s = hold_s
        self.min_interval_s = min_interval_s
        self._states: dict[FindingKey, _State] = {}
        self._last_alert_t: dict[FindingKey, float] = {}  # outlives a clear: that is the rate limit

    def update(self, findings: Sequence[Finding], t: float) -> list[Alert]:
        """The alerts due at time ``t`` given the findings shown now."""
        alerts: list[Alert] = []
        current = {f.key: f for f in findings if f.severity in ALERT_SEVERITIES}
        for key, state in list(self._states.items()):
            if key not in current:
                del self._states[key]
                if state.alerted_severity is not None:
                    alerts.append(Alert("cleared", state.finding, t, t - state.since_t))
        for key, finding in current.items():
            state = self._states.setdefault(key, _State(finding, t))
            state.finding = finding
            if t - state.since_t < self.hold_s:
                continue
            if state.alerted_severity is None:
                kind: AlertKind = "raised"
            elif SEVERITIES.index(finding.severity) > SEVERITIES.index(state.alerted_severity):
                kind = "worsened"
            else:
                continue
            if t - self._last_alert_t.get(key, float("-inf")) < self.min_interval_s:
                continue
            state.alerted_severity = finding.severity
            self._last_alert_t[key] = t
            alerts.append(Alert(kind, finding, t, t - state.since_t))
        return alerts

    def held(self, t: float) -> list[tuple[Finding, float]]:
        """The shown warn/critical findings that have held for ``hold_s`` at time ``t``, with how long."""
        return [(s.finding, t - s.since_t) for s in self._states.values() if t - s.since_t >= self.hold_s]


def briefs(findings: Sequence[Finding]) -> dict[str, tuple[FindingBrief, ...]]:
    """The findings of each run as its ranks get them (``FindingsNotice``), worst first as shown."""
    by_run: dict[str, list[FindingBrief]] = {}
    for f in findings:
        if f.run_id is not None:
            brief = FindingBrief(cause=f.cause, severity=f.severity, title=f.title[:300], ranks=f.ranks[:64])
            by_run.setdefault(f.run_id, []).append(brief)
    return {run: tuple(items[:MAX_FINDINGS_NOTICED]) for run, items in by_run.items()}


class FindingsToRanks:
    """Which runs' ranks must hear about their findings now: those whose findings changed since last told."""

    def __init__(self) -> None:
        self._told: dict[str, tuple[FindingBrief, ...]] = {}

    def changed(self, findings: Sequence[Finding]) -> dict[str, tuple[FindingBrief, ...]]:
        now = briefs(findings)
        due = {run: items for run, items in now.items() if self._told.get(run) != items}
        due.update({run: () for run, told in self._told.items() if told and run not in now})  # cleared
        self._told.update(due)
        return due
