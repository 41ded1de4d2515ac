"""Border titles that repaint only when they change.

Textual repaints a widget, and everything inside it, on every assignment to
``border_title``, equal or not.  The dashboard rewrites its titles on each
refresh, so assigning them blindly repainted the ranks box and the findings
box (most of the screen) twice a second for nothing.
"""

from __future__ import annotations

from textual.content import Content
from textual.widget import Widget


def set_border_title(widget: Widget, title: str | Content) -> None:
    """Give ``widget`` this border title, repainting it only if the title (text or style) changed."""
    markup = title if isinstance(title, str) else title.markup
    if getattr(widget, "_gputop_title", None) != markup:
        widget._gputop_title = markup  # type: ignore[attr-defined]
        widget.border_title = title
