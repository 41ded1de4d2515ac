"""Sparklines of one rank's recent windows: step time, loader wait, exposed comm, GPU util."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Label, Sparkline

from gputop.model.figures import RankSeries
from gputop.tui.format import NA, fmt_frac, fmt_pct, fmt_s

# (id, label, series attribute, how the newest value reads)
_LINES: tuple[tuple[str, str, str, Callable[[float | None], str]], ...] = (
    ("step", "step time", "step_s", fmt_s),
    ("loader", "loader wait", "loader_wait_frac", fmt_frac),
    ("comm", "exposed comm", "exposed_comm_frac", fmt_frac),
    ("util", "GPU util", "gpu_util_pct", fmt_pct),
)


def _present(values: Sequence[float | None]) -> list[float]:
    """Sparkline points: N/A windows are left out rather than drawn as zero."""
    return [v for v in values if v is not None]


class HistoryPanel(Widget):
    """Four labelled sparklines for the selected rank (the GPU line only when GPU data exists)."""

    DEFAULT_CSS = """
    HistoryPanel {
        height: auto;
    }
    HistoryPanel > Horizontal {
        height: 1;
    }
    HistoryPanel .history-label {
        width: 14;
        color: $text-muted;
    }
    HistoryPanel .history-value {
        width: 8;
        text-align: right;
        margin-right: 1;
    }
    HistoryPanel .history-na {
        color: $text-muted;
    }
    HistoryPanel Sparkline {
        width: 1fr;
    }
    """

    series: reactive[RankSeries | None] = reactive(None)
    """The selected rank's histories (None: no rank selected)."""

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

    def compose(self) -> ComposeResult:
        for key, label, _, _ in _LINES:
            with Horizontal(id=f"history-{key}"):
                yield Label(label, classes="history-label")
                yield Label(NA, classes="history-value history-na")
                yield Sparkline([], summary_function=max)

    def on_mount(self) -> None:
        self._draw(self.series)  # is_mounted turns True only after this handler

    def watch_series(self, series: RankSeries | None) -> None:
        if self.is_mounted:
            self._draw(series)

    def _draw(self, series: RankSeries | None) -> None:
        for key, _, attribute, fmt in _LINES:
            line = self.query_one(f"#history-{key}", Horizontal)
            values: Sequence[float | None] = getattr(series, attribute) if series is not None else ()
            # GPU util is hidden for a rank with no GPU, rather than shown as an empty line.
            line.display = key != "util" or series is None or bool(values)
            points = _present(values)
            value_label = line.query_one(".history-value", Label)
            newest = next((v for v in reversed(values) if v is not None), None)
            value_label.update(fmt(newest))
            value_label.set_class(newest is None, "history-na")
            line.query_one(Sparkline).data = points
