"""The run's step time and throughput over time, and each GPU's utilization and memory: the main screen's charts.

Drawn from per-second histories the store keeps as windows arrive
(``RunHistory``) and from the GPU samples, one character a second, newest at
the right; one render, no child widgets, so a refresh costs a few string joins
whatever the rank count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from textual.app import RenderResult
from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

from gputop.model.samples import GpuSample
from gputop.model.snapshot import RunHistory
from gputop.tui.format import NA, fmt_gib, fmt_pct, fmt_rate, fmt_s

BLOCKS = "▁▂▃▄▅▆▇█"
MUTED = "$foreground-muted"  # not $text-muted, which Content resolves as "auto": white on a dark theme
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
    lines = []
    for row in range(rows - 1, -1, -1):
        floor = row * 8
        cells = []
        for level in eighths:
            if level is None or level <= floor:
                cells.append(" ")
            else:
                cells.append(BLOCKS[min(level - floor, 8) - 1])
        lines.append(pad + "".join(cells))
    return lines


def _gpus(samples: Sequence[GpuSample]) -> int:
    return len(samples[-1].gpus) if samples else 0


def _newest(values: Sequence[float | None]) -> float | None:
    return next((v for v in reversed(values) if v is not None), None)


class RunChart(Widget):
    """Step time and samples/s of one run; per GPU, utilization and memory used, when GPUs report."""

    DEFAULT_CSS = """
    RunChart {
        height: 1fr;
    }
    """

    # New data repaints the chart; only a change in its number of GPUs lays the screen out
    # again (a layout of the whole screen on every refresh was most of a 2-rank dashboard's CPU).
    history: reactive[RunHistory | None] = reactive(None)
    """The run's per-second history (None: no run yet)."""
    gpu_history: reactive[tuple[GpuSample, ...]] = reactive(())
    """GPU samples, oldest first."""
    show_gpus: reactive[bool] = reactive(True)
    """Draw the per-GPU lines (off on short terminals)."""

    def on_mount(self) -> None:
        self._keep_lines()

    def watch_gpu_history(self, old: tuple[GpuSample, ...], new: tuple[GpuSample, ...]) -> None:
        if _gpus(old) != _gpus(new):
            self._keep_lines()

    def watch_show_gpus(self) -> None:
        self._keep_lines()

    def _keep_lines(self) -> None:
        """Never squeezed below a line a series and a GPU; the screen's layout gives the chart more when it can."""
        gpus = _gpus(self.gpu_history) if self.show_gpus else 0
        self.styles.min_height = 2 + gpus + self.styles.gutter.height

    def _lines(
        self,
        label: str,
        values: Sequence[float | None],
        fmt: Callable[[float | None], str],
        style: str,
        rows: int = 1,
    ) -> list[Content]:
        """One series: its label and newest value left of a chart ``rows`` lines tall; taller, its peak too."""
        width = max(self.size.width - LABEL_W - VALUE_W - 2, 8)
        newest = _newest(values)
        shown = [v for v in values[-width:] if v is not None]
        left = [
            Content.assemble(
                (f"{label:<{LABEL_W}}", MUTED),
                (
                    f"{fmt(newest) if newest is not None else NA:>{VALUE_W}} ",
                    "" if newest is not None else MUTED,
                ),
            )
        ]
        if rows > 2 and shown:  # the top of the scale, so the bars' height reads as a number
            left.append(Content.styled(f"{'peak':<{LABEL_W}}{fmt(max(shown)):>{VALUE_W}} ", MUTED))
        blank = Content(" " * (LABEL_W + VALUE_W + 1))
        chart = spark_rows(values, width, rows)
        return [Content.assemble(left[i] if i < len(left) else blank, (line, style)) for i, line in enumerate(chart)]

    def _gpu_lines(self) -> list[Content]:
        samples = self.gpu_history
        if not samples or not samples[-1].gpus:
            return []
        width = max((self.size.width - LABEL_W - 2 * VALUE_W - 8) // 2, 4)
        lines = []
        for gpu in samples[-1].gpus:
            util: list[float | None] = []
            mem: list[float | None] = []
            for sample in samples[-width:]:
                reading = next((g for g in sample.gpus if g.uuid == gpu.uuid), None)
                util.append(reading.util_pct if reading is not None else None)
                mem.append(float(reading.mem_used_bytes) if reading and reading.mem_used_bytes is not None else None)
            total = float(gpu.mem_total_bytes) if gpu.mem_total_bytes else None
            newest_mem = _newest(mem)
            lines.append(
                Content.assemble(
                    (f"{f'GPU {gpu.index} util':<{LABEL_W}}", MUTED),
                    (f"{fmt_pct(_newest(util)) if _newest(util) is not None else NA:>{VALUE_W}} ", ""),
                    (spark(util, width, low=0.0, high=100.0), "$success"),
                    ("  mem", MUTED),
                    (f"{fmt_gib(int(newest_mem)) + 'G' if newest_mem is not None else NA:>{VALUE_W - 2}} ", ""),
                    (spark(mem, width, low=0.0, high=total), "$accent"),
                )
            )
        return lines

    def render(self) -> RenderResult:
        history = self.history
        if history is None:
            return Content.styled("no run yet", MUTED)
        gpu_lines = self._gpu_lines() if self.show_gpus else []
        # Given more height than a line a series (the screen has room), the two run charts share it.
        height = max(self.size.height - len(gpu_lines), 2)
        lines = [
            *self._lines("step mean", history.step_time_s, fmt_s, "$primary", height - height // 2),
            *self._lines("samples/s", history.samples_per_s, fmt_rate, "$secondary", height // 2),
            *gpu_lines,
        ]
        return Content("\n").join(lines)
