"""Diagnoser: findings that persist before they show and linger before they clear.

A finding is shown once its rule fired in ``show_after`` consecutive updates
and cleared only after ``clear_after`` consecutive updates without it, so the
panel neither flashes a one-window blip nor flickers on a value hovering at a
threshold.  Severity has the same hysteresis: a shown finding escalates after
``show_after`` updates at the higher level and calms down after ``clear_after``
updates below it.  Still pure: no clock, no I/O; it is fed snapshots.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gputop.collect.store import Snapshot
from gputop.diagnose.engine import DEFAULT_SPAN_S, diagnose, worst_first
from gputop.diagnose.findings import SEVERITIES, Finding

SHOW_AFTER_UPDATES = 3  # at the dashboard's ~1 s refresh: a cause must hold for 3 s to appear
CLEAR_AFTER_UPDATES = 5  # and be gone for 5 s to disappear

Key = tuple[str | None, str, tuple[int, ...], tuple[int, ...]]


@dataclass
class _Track:
    latest: Finding  # the newest firing, for its current numbers
    hits: int = 0  # consecutive updates it fired
    misses: int = 0  # consecutive updates it did not
    shown: bool = False
    shown_severity: str = "info"
    severity_streak: int = 0  # consecutive updates the fired severity differed from the shown one


class Diagnoser:
    """Stateful wrapper around ``diagnose`` for a live panel."""

    def __init__(
        self,
        *,
        span_s: float = DEFAULT_SPAN_S,
        show_after: int = SHOW_AFTER_UPDATES,
        clear_after: int = CLEAR_AFTER_UPDATES,
    ) -> None:
        if show_after < 1 or clear_after < 1:
            raise ValueError("show_after and clear_after must be at least 1")
        self.span_s = span_s
        self.show_after = show_after
        self.clear_after = clear_after
        self._tracks: dict[Key, _Track] = {}

    def update(self, snapshot: Snapshot) -> list[Finding]:
        """Diagnose one more snapshot; the findings to show now, worst first."""
        return self.feed(diagnose(snapshot, span_s=self.span_s))

    def feed(self, fired: list[Finding]) -> list[Finding]:
        """The hysteresis alone, on one update's raw findings (``update`` calls this)."""
        seen: set[Key] = set()
        for finding in fired:
            key = self._match(finding, seen)
            seen.add(key)
            track = self._tracks.get(key)
            if track is None:
                track = self._tracks[key] = _Track(latest=finding)
            track.latest, track.hits, track.misses = finding, track.hits + 1, 0
            if not track.shown and track.hits >= self.show_after:
                track.shown, track.shown_severity, track.severity_streak = True, finding.severity, 0
            elif track.shown:
                self._settle_severity(track, finding.severity)
        for key, track in list(self._tracks.items()):
            if key in seen:
                continue
            track.hits, track.misses = 0, track.misses + 1
            if not track.shown or track.misses >= self.clear_after:
                del self._tracks[key]
        return worst_first(replace(t.latest, severity=t.shown_severity) for t in self._tracks.values() if t.shown)

    def _match(self, finding: Finding, taken: set[Key]) -> Key:
        """The track this finding continues.

        Exactly the same key if tracked; otherwise a track of the same run and
        cause whose ranks (or GPUs) overlap, so a finding whose rank set drifts
        by one rank (a rank hovering at the threshold) keeps its history instead
        of restarting as a new finding.
        """
        key = finding.key
        if key in self._tracks or key in taken:
            return key
        for other_key, track in self._tracks.items():
            if other_key in taken or track.latest.run_id != finding.run_id or track.latest.cause != finding.cause:
                continue
            old = track.latest
            if set(old.ranks) & set(finding.ranks) or set(old.gpus) & set(finding.gpus):
                self._tracks[key] = self._tracks.pop(other_key)
                return key
        return key

    def _settle_severity(self, track: _Track, fired: str) -> None:
        if fired == track.shown_severity:
            track.severity_streak = 0
            return
        track.severity_streak += 1
        worse = SEVERITIES.index(fired) > SEVERITIES.index(track.shown_severity)
        if track.severity_streak >= (self.show_after if worse else self.clear_after):
            track.shown_severity, track.severity_streak = fired, 0
