"""Sparklines of one rank's recent windows: step time, loader wait, exposed comm, GPU util.

One widget that draws its lines as text (the run chart's ``spark``), not four
rows of Label and Sparkline widgets: Textual's Sparkline blends a colour per
cell and a Label's update lays the whole screen out again, which together were
most of what a 2-rank dashboard cost on each refresh.  A new window repaints
only the lines it changed (Textual's compositor costs ~0.1 ms a line it repaints),
not the panel's title line or a sparkline that stayed the same, and each line is
drawn as a strip once per change (``gputop.tui.strips``), not styled again as
Content on every paint.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from textual.geometry import Region, Size
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from gputop.model.figures import RankSeries
from gputop.tui.format import fmt_frac, fmt_pct, fmt_s
from gputop.tui.strips import Part, PartStyles, draw
from gputop.tui.widgets.run_chart import spark

# (label, series attribute, how the newest value reads, the line's colour: the phase legend's where it has one)
_LINES: tuple[tuple[str, str, Callable[[float | None], str], str], ...] = (
    ("step time", "step_s", fmt_s, "$primary"),
    ("loader wait", "loader_wait_frac", fmt_frac, "$error"),
    ("exposed comm", "exposed_comm_frac", fmt_frac, "$warning"),
    ("GPU util", "gpu_util_pct", fmt_pct, "$success"),
)
LABEL_W = 14
VALUE_W = 8


def _present(values: Sequence[float | None]) -> list[float]:
    """Sparkline points: N/A windows are left out rather than drawn as zero."""
    return [v for v in values if v is not None]


def fit(points: Sequence[float], width: int) -> list[float | None]:
    """At most ``width`` points: consecutive points merged by their max (a slow step stays visible)."""
    if width <= 0:
        return []
    if len(points) <= width:
        return list(points)
    per = -(-len(points) // width)  # ceil: the newest points keep the right edge
    start = len(points) - per * (len(points) // per)
    merged: list[float | None] = [max(points[:start])] if start else []
    merged += [max(points[i : i + per]) for i in range(start, len(points), per)]
    return merged[-width:]


class HistoryPanel(Widget):
    """Labelled sparklines for the selected rank (the GPU line only when GPU data exists)."""

    DEFAULT_CSS = """
    HistoryPanel {
        height: auto;
        /* A line is exactly as wide as the panel: one drawn a moment before a scrollbar
           took two cells must be cut, not wrapped onto a second line. */
        text-wrap: nowrap;
        text-overflow: clip;
    }
    """

    series: reactive[RankSeries | None] = reactive(None, repaint=False)
    """The selected rank's histories (None: no rank selected)."""

    # What the lines show, as (text, style) parts, for the series and width they were made
    # for: a new series is compared with them line by line.
    _shown: tuple[RankSeries | None, int, list[tuple[Part, ...]]] | None = None

    def __init__(
        self,
        *,
        series: RankSeries | None = None,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        """Build the panel.

        Args:
            series: Initial histories.
            name: The widget's name.
            id: The widget's DOM id.
            classes: Space-separated CSS classes.
        """
        super().__init__(name=name, id=id, classes=classes)
        self.set_reactive(HistoryPanel.series, series)
        self._styles = PartStyles(self)
        self._drawn: dict[int, tuple[tuple[Part, ...], int, Strip]] = {}  # line -> the parts and width drawn, the strip

    @staticmethod
    def _shows_gpu(series: RankSeries | None) -> bool:
        # GPU util is hidden for a rank with no GPU, rather than shown as an empty line.
        return series is None or bool(series.gpu_util_pct)

    def watch_series(self, old: RankSeries | None, new: RankSeries | None) -> None:
        if self._shows_gpu(old) != self._shows_gpu(new):
            self.refresh(layout=True)  # a line more or less
            return
        shown, lines = self._shown, self._lines()
        if shown is None or shown[1] != self.size.width or len(shown[2]) != len(lines):
            self.refresh()  # not drawn at this width, or with another number of lines: all of it
            return
        for y, (before, now) in enumerate(zip(shown[2], lines, strict=True)):
            if before != now:
                self.refresh(Region(0, y, self.size.width, 1))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return 3 + self._shows_gpu(self.series)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()  # a new theme: new colours
        self._drawn.clear()

    def render_line(self, y: int) -> Strip:
        lines, width = self._lines(), self.size.width
        if y >= len(lines):
            return Strip.blank(width, self.visual_style.rich_style)
        drawn = self._drawn.get(y)
        if drawn is None or drawn[0] != lines[y] or drawn[1] != width:
            drawn = self._drawn[y] = (lines[y], width, draw(lines[y], self._styles, width))
        return drawn[2]

    @property
    def text(self) -> str:
        """The panel's lines as plain text."""
        return "\n".join(self.render_line(y).text for y in range(len(self._lines())))

    def _lines(self) -> list[tuple[Part, ...]]:
        """Each line's (text, style) parts for the series and width now, made once per change of either."""
        series, width = self.series, self.size.width
        shown = self._shown
        if shown is not None and shown[0] is series and shown[1] == width:
            return shown[2]
        spark_w = max(width - LABEL_W - VALUE_W - 1, 4)
        lines: list[tuple[Part, ...]] = []
        for label, attribute, fmt, style in _LINES:
            if attribute == "gpu_util_pct" and not self._shows_gpu(series):
                continue
            values: Sequence[float | None] = getattr(series, attribute) if series is not None else ()
            newest = next((v for v in reversed(values) if v is not None), None)
            lines.append(
                (
                    (f"{label:<{LABEL_W}}", "$foreground-muted"),
                    (f"{fmt(newest):>{VALUE_W}} ", "" if newest is not None else "$foreground-muted"),
                    (spark(fit(_present(values), spark_w), spark_w), style),  # newest at the right, as in the run chart
                )
            )
        self._shown = (series, width, lines)
        return lines
