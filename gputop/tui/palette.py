"""Theme colours as Rich styles, for content built outside Textual's CSS (table cells).

Read from the running app's theme on every refresh, so switching to a light
theme recolours the table on the next redraw instead of leaving near-white text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual.app import App

from gputop.combine import PHASES

# A phase's colour without a theme, by the theme variable it is drawn in; a phase with none is grey,
# readable on light and dark themes alike.
GREY = "#8a8a8a"
_PLAIN = {"error": "red", "primary": "blue", "secondary": "magenta", "success": "green", "warning": "yellow"}


@dataclass(frozen=True)
class Palette:
    """Rich style strings for the states the dashboard colours."""

    ok: str = "green"
    warn: str = "yellow"
    bad: str = "red"
    accent: str = "cyan"
    muted: str = "dim"
    # Each phase's colour (gputop.combine.PHASES names its theme variable), for the table's bars.
    phases: dict[str, str] = field(default_factory=lambda: {p.name: _PLAIN.get(p.theme, GREY) for p in PHASES})

    @classmethod
    def from_app(cls, app: App[Any]) -> Palette:
        """The current theme's success/warning/error/accent colours."""
        variables = app.theme_variables
        return cls(
            ok=variables.get("success", cls.ok),
            warn=variables.get("warning", cls.warn),
            bad=variables.get("error", cls.bad),
            accent=variables.get("accent", cls.accent),
            muted="dim",
            phases={p.name: variables.get(p.theme, _PLAIN.get(p.theme, GREY)) for p in PHASES},
        )

    def phase(self, name: str) -> str:
        """The colour of one phase of a step (gputop.combine.PHASES)."""
        return self.phases.get(name, self.muted)

    def level(self, frac: float | None, warn_at: float, bad_at: float) -> str:
        """A colour for a share that is worse the higher it is ("" when fine or N/A)."""
        if frac is None:
            return self.muted
        if frac >= bad_at:
            return self.bad
        if frac >= warn_at:
            return self.warn
        return ""
