"""Diagnoser: findings that persist before they show and linger before they clear.

A finding is shown once its rule has fired in every update for ``show_after_s``
seconds (of snapshot time, so a replay at 4x behaves like the live run), and
cleared only once it has not fired for ``clear_after_s``, so the panel neither
flashes a one-window blip nor flickers on a value hovering at a threshold.
Severity has the same hysteresis: a shown finding escalates once the higher
level has held for ``show_after_s`` and calms down once the lower one has held
for ``clear_after_s``; until it does, the last firing at the shown severity is
shown, so a badge never contradicts its title.  Still pure: time comes with
each update, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gputop.diagnose.engine import diagnose, worst_first
from gputop.diagnose.findings import SEVERITIES, Finding, FindingKey, Severity
from gputop.model.figures import Figures

# At the dashboard's default 0.5-s refresh: a cause shows after firing in 3
# updates in a row and clears after 5 updates without it.
SHOW_AFTER_S = 1.0
CLEAR_AFTER_S = 2.0
_EPSILON_S = 1e-6  # snapshot times are sums of floats: 0.1 * 3 must count as 0.3


@dataclass
class _Track:
    latest: Finding  # the newest firing, for its current numbers
    shown_as: Finding  # the newest firing at the shown severity: what is shown, so its words match its severity
    firing_since_t: float  # the first update of the current unbroken run of firings
    missing_since_t: float | None = None  # the first update, since the last firing, without it
    shown: bool = False
    shown_severity: Severity = "info"
    other_severity_since_t: float | None = None  # since when the fired severity differs from the shown one


class Diagnoser:
    """Stateful wrapper around ``diagnose`` for a live panel."""

    def __init__(self, *, show_after_s: float = SHOW_AFTER_S, clear_after_s: float = CLEAR_AFTER_S) -> None:
        if show_after_s < 0 or clear_after_s < 0:
            raise ValueError("show_after_s and clear_after_s must not be negative")
        self.show_after_s = show_after_s
        self.clear_after_s = clear_after_s
        self._tracks: dict[FindingKey, _Track] = {}

    def update(self, figures: Figures) -> list[Finding]:
        """Diagnose one more refresh's figures; the findings to show now, worst first."""
        return self.feed(diagnose(figures), figures.t)

    def feed(self, fired: Sequence[Finding], t: float) -> list[Finding]:
        """The hysteresis alone, on one update's raw findings at time ``t`` (``update`` calls this)."""
        seen: set[FindingKey] = set()
        for finding in fired:
            key = self._match(finding, seen)
            seen.add(key)
            track = self._tracks.get(key)
            if track is None:
                track = self._tracks[key] = _Track(latest=finding, shown_as=finding, firing_since_t=t)
            elif track.missing_since_t is not None:  # fired again after a gap: a new run of firings
                track.firing_since_t, track.missing_since_t = t, None
            track.latest = finding
            if not track.shown and self._held(track.firing_since_t, t, self.show_after_s):
                track.shown, track.shown_severity, track.other_severity_since_t = True, finding.severity, None
            elif track.shown:
                self._settle_severity(track, finding.severity, t)
            if finding.severity == track.shown_severity or not track.shown:
                track.shown_as = finding
        for key, track in list(self._tracks.items()):
            if key in seen:
                continue
            if track.missing_since_t is None:
                track.missing_since_t = t
            if not track.shown or self._held(track.missing_since_t, t, self.clear_after_s):
                del self._tracks[key]
        # While a severity settles, the last firing at the shown one is shown: a warning badge
        # over a title that says "too close to call" would contradict itself.
        return worst_first(t.shown_as for t in self._tracks.values() if t.shown)

    @staticmethod
    def _held(since_t: float, t: float, needed_s: float) -> bool:
        return t - since_t >= needed_s - _EPSILON_S

    def _match(self, finding: Finding, taken: set[FindingKey]) -> FindingKey:
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

    def _settle_severity(self, track: _Track, fired: Severity, t: float) -> None:
        if fired == track.shown_severity:
            track.other_severity_since_t = None
            return
        if track.other_severity_since_t is None:
            track.other_severity_since_t = t
        worse = SEVERITIES.index(fired) > SEVERITIES.index(track.shown_severity)
        if self._held(track.other_severity_since_t, t, self.show_after_s if worse else self.clear_after_s):
            track.shown_severity, track.other_severity_since_t = fired, None
