"""Theme colours as Rich styles, for content built outside Textual's CSS (table cells).

Read from the running app's theme on every refresh, so switching to a light
theme recolours the table on the next redraw instead of leaving near-white text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.app import App


@dataclass(frozen=True)
class Palette:
    """Rich style strings for the states the dashboard colours."""

    ok: str = "green"
    warn: str = "yellow"
    bad: str = "red"
    accent: str = "cyan"
    muted: str = "dim"
    # The phase colours of the detail screen's bar (PHASE_STYLES), for the table's bars.
    loader: str = "red"
    forward: str = "blue"
    backward: str = "magenta"
    exposed_comm: str = "yellow"
    other: str = "#8a8a8a"

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
            loader=variables.get("error", cls.loader),
            forward=variables.get("primary", cls.forward),
            backward=variables.get("secondary", cls.backward),
            exposed_comm=variables.get("warning", cls.exposed_comm),
            other=cls.other,
        )

    def phase(self, name: str) -> str:
        """The colour of one phase of a step (loader, forward, backward, exposed_comm, other)."""
        return str(getattr(self, name, self.muted))

    def level(self, frac: float | None, warn_at: float, bad_at: float) -> str:
        """A colour for a share that is worse the higher it is ("" when fine or N/A)."""
        if frac is None:
            return self.muted
        if frac >= bad_at:
            return self.bad
        if frac >= warn_at:
            return self.warn
        return ""
