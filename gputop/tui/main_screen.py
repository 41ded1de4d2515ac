"""The dashboard's main screen: the widgets on it, how a ``DashboardView`` is drawn on them, and its clicks.

The header, the GPU panel, the ranks table and the findings side by side in the
"middle", the run chart and the selected rank's history.  ``show`` copies a view
into them; the middle is fitted to the lines its content needs, so the run chart
gets what the table leaves.  The rank under the table's cursor is told to the
figures worker, which carries that rank's history in its views.  Which view is
shown (live, paused, from the past) and what the keys do is the app's
(``gputop.tui.app``).
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.css.scalar import Scalar
from textual.screen import Screen
from textual.widgets import Footer

from gputop.tui.figures_worker import FiguresWorker
from gputop.tui.messages import RowHighlighted, RowSelected
from gputop.tui.palette import Palette
from gputop.tui.screens.detail import RankDetailScreen
from gputop.tui.titles import set_border_title
from gputop.tui.view import DashboardView
from gputop.tui.widgets.empty_state import EmptyState
from gputop.tui.widgets.findings import FindingsPanel
from gputop.tui.widgets.gpu_panel import GpuPanel
from gputop.tui.widgets.header import HeaderBar
from gputop.tui.widgets.history import HistoryPanel
from gputop.tui.widgets.phase_bar import phase_legend
from gputop.tui.widgets.rank_cells import evidence_highlight
from gputop.tui.widgets.ranks_table import RanksTable
from gputop.tui.widgets.run_chart import RunChart

SHORT_HEIGHT = 32  # below this many lines: GPUs packed, findings brief, sparklines only in the detail screen


class MainScreen(Screen[None]):
    """The dashboard's screen under every other; empty (the how-to on show) until a view with ranks comes."""

    AUTO_FOCUS = "#ranks"

    def __init__(self, worker: FiguresWorker, *, source_text: str, price_per_hour: float | None) -> None:
        """Build the screen.

        Args:
            worker: The figures thread: told the rank under the cursor, so that its views carry its history.
            source_text: What the data comes from, in the header and the how-to.
            price_per_hour: A GPU-hour's price: the findings' waste is shown in money too.
        """
        super().__init__(classes="-empty")
        self.worker = worker
        self.view: DashboardView | None = None  # what is drawn
        # Kept as attributes: the app reaches them while a detail screen is on top, and drawing queries nothing.
        self.header = HeaderBar(source_text=source_text, id="header")
        self.gpus = GpuPanel(id="gpus")
        self.empty = EmptyState(id="empty")
        self.ranks_box = Vertical(id="ranks-box")
        self.table = RanksTable(id="ranks")
        self.findings_box = VerticalScroll(id="findings-box")
        self.findings = FindingsPanel(id="findings", price_per_hour=price_per_hour)
        self.history = HistoryPanel(id="history")
        self.chart = RunChart(id="run-chart")
        self.chart.border_title = "run"
        self.gpus.border_title = "GPUs"
        self.ranks_box.border_title = "ranks"
        self.findings_box.border_title = "findings"
        self.history.border_title = "history"
        self.empty.border_title = "waiting for a run"
        self.empty.source_text = source_text
        self.findings.diagnosis = "off" if self.worker.pipeline.diagnoser is None else "waiting"
        self.middle = Horizontal(id="middle")

    def compose(self) -> ComposeResult:
        yield self.header
        yield self.gpus
        yield self.empty
        with self.middle:
            with self.ranks_box:
                yield self.table
            with self.findings_box:
                yield self.findings
        yield self.chart
        yield self.history
        yield Footer()

    # -- the selected rank -------------------------------------------------------

    @property
    def selected(self) -> str | None:
        """The rank the table's cursor is on (a "run:rank" key): its history is drawn, so snapshots carry it."""
        return self.worker.selected

    @selected.setter
    def selected(self, key: str | None) -> None:
        self.worker.selected = key

    # -- what the table says, and what the app's keys ask of the screen ---------

    def on_row_highlighted(self, event: RowHighlighted) -> None:
        key = event.key
        if key != self.selected and not key.startswith("host:"):
            self.selected = key
            self._show_history()

    def on_row_selected(self, event: RowSelected) -> None:
        """Enter or a click: a rank opens its detail, a host folds or unfolds."""
        key = event.key
        if key.startswith("host:"):
            self.table.toggle_fold(key)
            self._title_ranks(self.table)
            return
        self.selected = key
        self.open_rank()

    def on_findings_resized(self) -> None:
        self.call_after_refresh(self._fit_middle)

    def on_sort_changed(self) -> None:
        self._title_ranks(self.table)

    def open_rank(self) -> None:
        """Open the selected rank's detail screen; on a host's row, fold or unfold the host instead."""
        if isinstance(self.app.screen, RankDetailScreen):
            return
        cursor = self.table.selected_key
        if cursor is not None and cursor.startswith("host:"):
            self.table.toggle_fold(cursor)
            self._title_ranks(self.table)
            return
        if self.view is None or self.selected is None or self.view.rank(self.selected) is None:
            return
        self.app.push_screen(RankDetailScreen(key=self.selected, view=self.view))

    def fold_all(self) -> None:
        """Fold every host, or open them all when all are folded."""
        table = self.table
        table.set_all_folded(not table.all_folded)
        self._title_ranks(table)

    def cycle_sort(self) -> None:
        """Sort the ranks by the next column."""
        table = self.table
        table.action_cycle_sort()
        self._title_ranks(table)

    # -- drawing ---------------------------------------------------------------

    def show(self, view: DashboardView) -> None:
        """Copy ``view`` into the widgets (also while another screen is on top: they are shown again as they are)."""
        self.view = view
        snapshot = view.snapshot
        self.header.show(view)
        self.set_class(view.empty, "-empty")

        gpus = self.gpus
        gpus.compact = self.app.size.height < SHORT_HEIGHT
        gpus.rows = view.gpu_rows
        gpus.unavailable = view.gpu_unavailable
        gpus.waiting = snapshot.gpu is None
        gpus.tooltip = self._gpu_tooltip(view)

        if view.empty:
            empty = self.empty
            empty.listen = snapshot.listen
            empty.rejected = snapshot.rejected
        else:
            table = self.table
            palette = Palette.from_app(self.app)
            top = view.findings[0] if view.findings else None
            table.show(view.rank_rows, palette, view.host_rows, evidence_highlight(top, view.rank_rows, palette))
            self._title_ranks(table)
            findings = self.findings
            findings.findings = view.findings
            findings.diagnosis = view.diagnosis
            findings.cpu_sharing = view.cpu_sharing
            findings.brief = self.app.size.height < SHORT_HEIGHT
            box = self.findings_box
            worst = view.findings[0].severity if view.findings else ""
            box.set_class(worst == "critical", "-critical")
            box.set_class(worst == "warn", "-warn")
            set_border_title(box, f"findings ({len(view.findings)})" if view.findings else "findings")
            if self.selected is None or view.row(self.selected) is None:
                cursor = table.selected_key
                self.selected = cursor if cursor is not None and not cursor.startswith("host:") else None
            self._show_history()
            self._show_chart()

    def middle_lines(self) -> int:
        """The lines the table and the findings need: the middle's height at most.

        From their content, not from the layout's result, which the middle's own
        height constrains.
        """
        table_lines = self.table.virtual_size.height + self.ranks_box.styles.gutter.height  # header + rows + border
        findings = self.findings
        width = findings.size.width
        box = self.findings_box
        findings_lines = box.styles.gutter.height + (
            findings.get_content_height(findings.size, findings.size, width) if width else 0
        )
        cap = box.styles.max_height
        if cap is not None and cap.is_cells:
            findings_lines = min(findings_lines, int(cap.value))
        if self.has_class("-narrow"):
            return table_lines + findings_lines
        return max(table_lines, findings_lines)

    @property
    def middle_fitted(self) -> bool:
        """Whether the middle's height is what its content needs (tests wait for it before a snapshot)."""
        return self.middle.styles.max_height == Scalar.from_number(self.middle_lines())

    def _fit_middle(self) -> None:
        """The table and findings no taller than their lines, so the run chart gets what they leave.

        Both the middle and the chart are fractions of the height; the middle's
        maximum is what its content needs (the table scrolls within it when
        that is more than the screen has), and Textual gives the rest to the chart.
        """
        if not self.middle_fitted:
            self.middle.styles.max_height = self.middle_lines()

    def _title_ranks(self, table: RanksTable) -> None:
        view = self.view
        n = len(view.rank_rows) if view else 0
        title = f"ranks ({n}) · sort: {table.sort_key.name}"
        if view and view.grouped:
            title += f" · {view.hosts} hosts{' folded' if table.all_folded else ''}"
        if view and any(r.slowest for r in view.rank_rows):
            title += " · ▲ slowest"
        # The phase bars' legend rides on the title, where the eye starts reading the table.
        shown = {phase for row in view.rank_rows for phase, _ in row.phases} if view else set()
        set_border_title(self.ranks_box, Content.assemble(title, "  ", phase_legend(Palette.from_app(self.app), shown)))
        self.call_after_refresh(self._fit_middle)  # rows shown, folded or opened: the table's height follows

    def _show_chart(self) -> None:
        """The run of the selected rank (else the first run): step time, samples/s, and every GPU."""
        view = self.view
        if view is None or not view.snapshot.runs:
            return
        runs = view.snapshot.runs
        run_id = self.selected.rsplit(":", 1)[0] if self.selected else runs[0].run_id
        run = next((r for r in runs if r.run_id == run_id), runs[0])
        chart = self.chart
        # The GPUs of the selected rank's host (its node sampler's), else this machine's.
        rank = view.rank(self.selected) if self.selected else None
        host = (rank or run.ranks[0]).hello.hostname if (rank or run.ranks) else ""
        chart.show(
            history=run.history,
            gpu_history=view.snapshot.gpu_history_of(host),
            show_gpus=self.app.size.height >= SHORT_HEIGHT,
        )
        on = f" · GPUs of {host}" if host in view.snapshot.node_gpu_history else ""
        set_border_title(chart, f"run {run.name or run.run_id} · per second, newest right{on}")

    def _show_history(self) -> None:
        view, key = self.view, self.selected
        history = self.history
        row = view.row(key) if (view is not None and key is not None) else None
        if view is None or key is None or row is None:
            history.series = None
            set_border_title(history, "history")
            return
        history.series = view.series(key)
        where = f" · GPU {row.gpu}" if row.gpu not in ("-", "cpu") else ""
        set_border_title(history, f"history · {row.run_name} rank {row.rank}{where}")

    @staticmethod
    def _gpu_tooltip(view: DashboardView) -> str | None:
        lines = []
        for row in view.gpu_rows:
            g = row.reading
            gpu = f"{row.hostname} GPU {g.index}" if row.hostname else f"GPU {g.index}"
            lines += [f"{gpu} {name}: N/A, {why}" for name, why in g.na.items()]
            lines += [
                f"{gpu}: pid {p.pid} {p.name or ''} is not a reporting rank".replace("  ", " ") for p in row.unobserved
            ]
        return "\n".join(lines) or None
