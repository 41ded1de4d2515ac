"""Lines drawn straight as strips from (text, style) parts, for widgets that repaint every second.

Textual's ``Content`` parses, wraps and styles its spans on every paint: ~340 µs
for the header's one line, ~1 ms for the history panel's four, and both change
every second.  Drawn as Rich segments, with each style worked out once per theme,
a line costs a few microseconds, and a line that did not change is not drawn
again at all.

Each style is resolved by letting ``Content`` paint one cell in it, in the
widget, so the colours are exactly those ``Content`` would paint (theme
variables, "auto" text colours, alpha blended over the widget's background).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.segment import Segment
from rich.style import Style
from textual.content import Content
from textual.strip import Strip
from textual.visual import Visual
from textual.widget import Widget

Part = str | tuple[str, str]
"""Text in the widget's own style, or (text, a Textual style such as "bold $accent")."""


class PartStyles:
    """Each part style's Rich style as ``Content`` paints it in one widget, resolved once per theme.

    The widget calls ``clear()`` from ``notify_style_update``: a new theme, new colours.
    """

    def __init__(self, widget: Widget) -> None:
        self._widget = widget
        self._styles: dict[str, Style] = {}

    def clear(self) -> None:
        self._styles.clear()

    def __call__(self, style: str) -> Style:
        resolved = self._styles.get(style)
        if resolved is None:
            widget = self._widget
            cell = Content.assemble(("x", style) if style else "x")
            (strip,) = Visual.to_strips(widget, cell, 1, 1, widget.visual_style)
            segment = next(s for s in strip if s.text)
            # Without the offset Content adds for text selection: the same style at every position.
            resolved = self._styles[style] = (segment.style or Style()).clear_meta_and_links()
        return resolved


def cells(parts: Sequence[Part]) -> int:
    """How many cells the parts take."""
    return sum(Segment(part if isinstance(part, str) else part[0]).cell_length for part in parts)


def draw(parts: Sequence[Part], styles: PartStyles, width: int) -> Strip:
    """The parts as one line exactly ``width`` cells wide: cut, or padded in the widget's style."""
    segments = [
        Segment(part, styles("")) if isinstance(part, str) else Segment(part[0], styles(part[1]))
        for part in parts
        if (part if isinstance(part, str) else part[0])
    ]
    return Strip(segments).adjust_cell_length(width, styles(""))
