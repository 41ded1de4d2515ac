"""The run's step time and throughput over time, and each GPU's utilization and memory: the main screen's charts.

Drawn from per-second histories the store keeps as windows arrive
(``RunHistory``) and from the GPU samples, one character a second, newest at
the right; no child widgets, and the lines are built as strips once per change
(Textual's Content markup and styling, per line and per paint, cost more than
the rest of a 2-rank refresh), so a refresh costs a few string joins whatever
the rank count.  New data repaints only the lines it changed: Textual's
compositor costs ~0.1 ms a line it repaints, and most of a tall chart's lines
(full blocks below the lowest value, the GPU lines when the step time moved)
stay as they were from one second to the next.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.segment import Segment
from rich.style import Style
from textual.color import Color
from textual.geometry import Region, Size
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from gputop.model.samples import GpuSample
from gputop.model.snapshot import RunHistory
from gputop.tui.format import NA, fmt_gib, fmt_pct, fmt_rate, fmt_s

BLOCKS = "▁▂▃▄▅▆▇█"
LABEL_W = 12
VALUE_W = 8


def spark(values: Sequence[float | None], width: int, *, low: float | None = None, high: float | None = None) -> str:
    """The newest ``width`` values as block characters scaled between low and high; N/A as a space."""
    shown = list(values[-width:]) if width > 0 else []
    known = [v for v in shown if v is not None]
    if not known:
        return " " * width
    lo = min(known) if low is None else low
    hi = max(known) if high is None else high
    span = hi - lo
    chars = []
    for v in shown:
        if v is None:
            chars.append(" ")
        elif span <= 0:
            chars.append(BLOCKS[len(BLOCKS) // 2] if low is None else BLOCKS[0])
        else:
            level = round((min(max(v, lo), hi) - lo) / span * (len(BLOCKS) - 1))
            chars.append(BLOCKS[level])
    return " " * (width - len(chars)) + "".join(chars)


def spark_rows(
    values: Sequence[float | None], width: int, rows: int, *, low: float = 0.0, high: float | None = None
) -> list[str]:
    """The newest ``width`` values as bars ``rows`` lines tall (eighths of a line each), top line first.

    One line is :func:`spark`; more lines give the same chart its height where
    the screen has room, so a 10% dip reads as a dip, not one block level.
    """
    if rows <= 1:
        return [spark(values, width, low=low, high=high)]
    shown = list(values[-width:]) if width > 0 else []
    known = [v for v in shown if v is not None]
    hi = (max(known) if known else 0.0) if high is None else high
    span = hi - low
    eighths: list[int | None] = []
    for v in shown:
        if v is None:
            eighths.append(None)
        else:
            share = (min(max(v, low), hi) - low) / span if span > 0 else 0.0
            eighths.append(max(round(share * rows * 8), 1))  # a value, however small, shows a sliver
    pad = " " * (width - len(shown))
    columns = []  # each value's column, top line first: blank, then a partial block, then full blocks
    for level in eighths:
        if level is None:
            columns.append(" " * rows)
            continue
        full, part = divmod(min(level, rows * 8), 8)
        columns.append(" " * (rows - full - (part > 0)) + (BLOCKS[part - 1] if part else "") + BLOCKS[-1] * full)
    return [pad + "".join(line) for line in zip(*columns, strict=True)] if columns else [pad] * rows


# A series' axis spans its data, padded by this share of the range (and at least this share of
# its top), so a 10% swing in step time fills most of the chart's height instead of the top
# eighth of a column of solid blocks.
AXIS_PAD = 0.15
AXIS_MIN_RANGE = 0.04


def axis(values: Sequence[float]) -> tuple[float, float]:
    """(low, high) for bars of ``values``: their range, padded, and never below zero."""
    if not values:
        return 0.0, 0.0
    lo, hi = min(values), max(values)
    pad = max((hi - lo) * AXIS_PAD, hi * AXIS_MIN_RANGE)
    return max(lo - pad, 0.0), hi


def _gpus(samples: Sequence[GpuSample]) -> int:
    return len(samples[-1].gpus) if samples else 0


def _newest(values: Sequence[float | None]) -> float | None:
    return next((v for v in reversed(values) if v is not None), None)


def _runs(lines: Sequence[int]) -> list[tuple[int, int]]:
    """Ascending line numbers as (start, stop) runs of consecutive lines: one repaint region each."""
    runs: list[tuple[int, int]] = []
    for y in lines:
        if runs and runs[-1][1] == y:
            runs[-1] = (runs[-1][0], y + 1)
        else:
            runs.append((y, y + 1))
    return runs


class RunChart(Widget):
    """Step time and samples/s of one run; per GPU, utilization and memory used, when GPUs report."""

    DEFAULT_CSS = """
    RunChart {
        height: 1fr;
    }
    """

    # New data repaints the lines it changed (``_redraw``), not the whole chart; only a change in its
    # number of GPUs lays the screen out again (a layout of the whole screen on every refresh was most
    # of a 2-rank dashboard's CPU).
    history: reactive[RunHistory | None] = reactive(None, repaint=False)
    """The run's per-second history (None: no run yet)."""
    gpu_history: reactive[tuple[GpuSample, ...]] = reactive((), repaint=False)
    """GPU samples, oldest first."""
    show_gpus: reactive[bool] = reactive(True, repaint=False)
    """Draw the per-GPU lines (off on short terminals)."""

    _strips: list[Strip] | None = None  # the lines drawn for the data and theme now; None: draw again
    _drawn_size: Size | None = None  # the size they were drawn for: at another, draw again
    _looks_now: dict[str, Style] | None = None  # the theme's styles, read once per style update
    _showing = False  # inside show(): the lines are drawn once, after every attribute is set
    _stale = False  # data changed inside show(), not drawn yet

    def show(self, *, history: RunHistory | None, gpu_history: tuple[GpuSample, ...], show_gpus: bool) -> None:
        """Show new data, drawing the lines once however many of the three changed."""
        self._showing = True
        try:
            self.show_gpus = show_gpus
            self.history = history
            self.gpu_history = gpu_history
        finally:
            self._showing = False
        if self._stale:
            self._redraw()

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        """Build the chart.

        Args:
            name: The widget's name.
            id: The widget's DOM id.
            classes: Space-separated CSS classes.
        """
        super().__init__(name=name, id=id, classes=classes)
        self._parts: dict[str, tuple[tuple[object, ...], list[Strip]]] = {}  # part -> (drawn from, its lines)

    def on_mount(self) -> None:
        self._keep_lines()

    def watch_history(self) -> None:
        self._changed()

    def watch_gpu_history(self, old: tuple[GpuSample, ...], new: tuple[GpuSample, ...]) -> None:
        if _gpus(old) != _gpus(new):
            self._keep_lines()
        self._changed()

    def watch_show_gpus(self) -> None:
        self._keep_lines()
        self._changed()

    def _keep_lines(self) -> None:
        """Never squeezed below a line a series and a GPU; the screen's layout gives the chart more when it can."""
        gpus = _gpus(self.gpu_history) if self.show_gpus else 0
        self.styles.min_height = 2 + gpus + self.styles.gutter.height

    def _changed(self) -> None:
        if self._showing:
            self._stale = True
        else:
            self._redraw()

    def _redraw(self) -> None:
        """Draw the lines for the data now and repaint those that differ from the lines on screen.

        A GPU sample every second on a machine without GPUs, a second whose bars
        reach no higher than the last: the lines stay as they are and nothing is
        repainted.  Before the first paint, or at another height, all of it is.
        """
        self._stale = False
        old = self._strips
        if old is None or self._drawn_size != self.size:
            self._strips = None
            self.refresh()
            return
        new = self._strips = self._draw()
        width = self.size.width
        changed = [y for y, (before, now) in enumerate(zip(old, new, strict=True)) if before != now]
        for start, stop in _runs(changed):
            self.refresh(Region(0, start, width, stop - start))

    # -- drawing: strips built once per change, not Content parsed and styled on every paint ----------

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips = self._looks_now = None  # the theme changed: its colours too
        self._parts.clear()

    def render_line(self, y: int) -> Strip:
        return self._current()[y]

    def _current(self) -> list[Strip]:
        """The lines for the data, size and theme now, drawn again only when one of them changed."""
        if self._strips is None or self._drawn_size != self.size:
            self._strips, self._drawn_size = self._draw(), self.size
        return self._strips

    @property
    def text(self) -> str:
        """What the chart shows, as plain text a line each."""
        return "\n".join(strip.text for strip in self._current())

    def _draw(self) -> list[Strip]:
        """One strip a line of the content's height, every one as wide as the content.

        The bars and the GPU lines are drawn apart, each again only when its own
        data changed: the GPU sampler's sample every second redraws the GPU lines
        (none without GPUs), a new second the bars.
        """
        looks = self._looks()
        width, height = self.size
        history = self.history
        if history is None:
            lines = self._fit([[Segment("no run yet", looks["muted"])]], looks)
        else:
            samples = self.gpu_history if self.show_gpus else ()
            gpu_lines = self._part("gpus", (samples, width, looks), lambda: self._gpu_lines(samples, looks))
            # Given more height than a line a series (the screen has room), the two run charts share it.
            rows = max(height - len(gpu_lines), 2)

            def bars() -> list[Strip]:
                step = self._lines("step mean", history.step_time_s, fmt_s, looks["primary"], looks, rows - rows // 2)
                rate = self._lines("samples/s", history.samples_per_s, fmt_rate, looks["secondary"], looks, rows // 2)
                return self._fit([*step, *rate], looks)

            lines = [*self._part("bars", (history, width, rows, looks), bars), *gpu_lines]
        blank = Strip([Segment(" " * width, looks["base"])], width)
        return [*lines[:height], *[blank] * (height - len(lines))]

    def _part(self, name: str, drawn_from: tuple[object, ...], draw: Callable[[], list[Strip]]) -> list[Strip]:
        """A part's lines, drawn again only when what they are drawn from changed."""
        kept = self._parts.get(name)
        if kept is not None and kept[0] == drawn_from:
            return kept[1]
        lines = draw()
        self._parts[name] = (drawn_from, lines)
        return lines

    def _fit(self, lines: list[list[Segment]], looks: dict[str, Style]) -> list[Strip]:
        """Lines as strips exactly as wide as the chart, padded with its background.

        Every character the chart draws (ASCII, "µ", block elements) is one cell
        wide, so a line's cells are its length: measuring a 150-cell bar of block
        characters cell by cell (what a Strip does unless told) cost more than
        drawing it.
        """
        width = self.size.width
        strips = []
        for line in lines:
            cells = sum(len(segment.text) for segment in line)
            if cells < width:
                strips.append(Strip([*line, Segment(" " * (width - cells), looks["base"])], width))
            else:
                strips.append(Strip(line, cells).crop(0, width))
        return strips

    def _looks(self) -> dict[str, Style]:
        """The widget's style, and its text in each theme colour the chart uses (over its background)."""
        if self._looks_now is not None:
            return self._looks_now
        base = self.rich_style
        background = Color.from_rich_color(base.bgcolor) if base.bgcolor is not None else Color(0, 0, 0)
        variables = self.app.theme_variables

        def colour(name: str) -> Style:
            return base + Style(color=(background + Color.parse(variables[name])).rich_color)

        looks = {name: colour(name) for name in ("primary", "secondary", "success", "accent")}
        self._looks_now = {**looks, "base": base, "muted": colour("foreground-muted")}
        return self._looks_now

    def _lines(
        self,
        label: str,
        values: Sequence[float | None],
        fmt: Callable[[float | None], str],
        style: Style,
        looks: dict[str, Style],
        rows: int = 1,
    ) -> list[list[Segment]]:
        """One series: its label and newest value left of a chart ``rows`` lines tall; taller, its peak too."""
        width = max(self.size.width - LABEL_W - VALUE_W - 2, 8)
        newest = _newest(values)
        shown = [v for v in values[-width:] if v is not None]
        muted = looks["muted"]
        value = f"{fmt(newest) if newest is not None else NA:>{VALUE_W}} "
        left = [[Segment(f"{label:<{LABEL_W}}", muted), Segment(value, looks["base"] if newest is not None else muted)]]
        low, high = axis(shown)
        if rows > 2 and shown:  # the top of the scale, so the bars' height reads as a number
            left.append([Segment(f"{'peak':<{LABEL_W}}{fmt(high):>{VALUE_W}} ", muted)])
        blank = [Segment(" " * (LABEL_W + VALUE_W + 1), looks["base"])]
        chart = spark_rows(values, width, rows, low=low, high=high)
        if rows > 3 and shown and low > 0:  # and its bottom: the bars start there, not at zero
            left += [blank] * (rows - 1 - len(left)) + [[Segment(f"{'from':<{LABEL_W}}{fmt(low):>{VALUE_W}} ", muted)]]
        return [[*(left[i] if i < len(left) else blank), Segment(line, style)] for i, line in enumerate(chart)]

    def _gpu_lines(self, samples: tuple[GpuSample, ...], looks: dict[str, Style]) -> list[Strip]:
        """A line per GPU of the newest sample: its utilization and memory over the samples."""
        if not samples or not samples[-1].gpus:
            return []
        width = max((self.size.width - LABEL_W - 2 * VALUE_W - 8) // 2, 4)
        base, muted = looks["base"], looks["muted"]
        lines: list[list[Segment]] = []
        for gpu in samples[-1].gpus:
            util: list[float | None] = []
            mem: list[float | None] = []
            for sample in samples[-width:]:
                reading = next((g for g in sample.gpus if g.uuid == gpu.uuid), None)
                util.append(reading.util_pct if reading is not None else None)
                mem.append(float(reading.mem_used_bytes) if reading and reading.mem_used_bytes is not None else None)
            total = float(gpu.mem_total_bytes) if gpu.mem_total_bytes else None
            newest_util, newest_mem = _newest(util), _newest(mem)
            mem_text = fmt_gib(int(newest_mem)) + "G" if newest_mem is not None else NA
            lines.append(
                [
                    Segment(f"{f'GPU {gpu.index} util':<{LABEL_W}}", muted),
                    Segment(f"{fmt_pct(newest_util) if newest_util is not None else NA:>{VALUE_W}} ", base),
                    Segment(spark(util, width, low=0.0, high=100.0), looks["success"]),
                    Segment("  mem", muted),
                    Segment(f"{mem_text:>{VALUE_W - 2}} ", base),
                    Segment(spark(mem, width, low=0.0, high=total), looks["accent"]),
                ]
            )
        return self._fit(lines, looks)
