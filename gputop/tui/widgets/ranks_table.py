"""The ranks table: one row per rank, grouped by run, sortable, updated in place."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.console import JustifyMethod
from rich.text import Text
from textual.reactive import reactive
from textual.widgets import DataTable

from gputop.model.snapshot import DONE, LIVE
from gputop.tui.format import NA, fmt_bytes, fmt_frac, fmt_gib, fmt_pct, fmt_rate, fmt_s
from gputop.tui.palette import Palette
from gputop.tui.view import RankRow

SLOWEST_MARK = "▲"
NARROW_BELOW = 106  # table width under which host and fwd/bwd are hidden


@dataclass(frozen=True)
class Column:
    """A table column: its key, header, width, and whether it shows on narrow screens."""

    key: str
    label: str
    width: int
    narrow: bool = True


COLUMNS = (
    Column("run", "run", 12),
    Column("rank", "rank", 5),
    Column("host", "host", 10, narrow=False),
    Column("gpu", "GPU", 4),
    Column("step", "step p50", 8),
    Column("samples", "samples/s", 9),
    Column("loader", "loader", 7),
    Column("fwdbwd", "fwd/bwd", 13, narrow=False),
    Column("comm", "comm", 6),
    Column("mem", "memory", 10),
    Column("cpu", "CPU%", 5),
    Column("status", "status", 6),
)


@dataclass(frozen=True)
class SortKey:
    """One way to order the ranks; rows without the value (N/A) go last."""

    name: str  # shown in the panel title
    column: str  # the column whose header gets the arrow
    value: Callable[[RankRow], float | None]
    descending: bool = True  # worst (largest) first


SORT_KEYS = (
    SortKey("rank", "rank", lambda r: float(r.rank), descending=False),
    SortKey("step p50", "step", lambda r: r.stats.step_time_p50_s),
    SortKey("loader wait", "loader", lambda r: r.stats.loader_wait_frac),
    SortKey("exposed comm", "comm", lambda r: r.stats.exposed_comm_frac),
    SortKey("samples/s", "samples", lambda r: r.stats.samples_per_s, descending=False),
    SortKey("memory", "mem", lambda r: r.stats.mem_allocated_bytes),
    SortKey("CPU%", "cpu", lambda r: r.stats.cpu_pct),
)


def sort_rows(rows: Sequence[RankRow], key: SortKey) -> list[RankRow]:
    """Rows grouped by run (in the order runs appeared), ordered by ``key`` inside each run."""
    run_order: dict[str, int] = {}
    for row in rows:
        run_order.setdefault(row.run_id, len(run_order))

    def order(row: RankRow) -> tuple[int, int, float, int]:
        value = key.value(row)
        missing = 1 if value is None else 0
        number = 0.0 if value is None else (-value if key.descending else value)
        return (run_order[row.run_id], missing, number, row.rank)

    return sorted(rows, key=order)


def _na(palette: Palette, justify: JustifyMethod = "right") -> Text:
    """N/A, dim: never a zero, so "not measured" cannot be read as "none"."""
    return Text(NA, style=palette.muted, justify=justify)


def _frac_cell(frac: float | None, palette: Palette, warn_at: float, bad_at: float) -> Text:
    if frac is None:
        return _na(palette)
    return Text(fmt_frac(frac), style=palette.level(frac, warn_at, bad_at), justify="right")


def row_cells(row: RankRow, palette: Palette) -> dict[str, Text]:
    """The text of every column for one rank."""
    s = row.stats
    mark = palette.bad if row.slowest else ""
    cells: dict[str, Text] = {
        "run": Text(row.run_name[:12], style="bold"),
        "rank": Text(f"{SLOWEST_MARK if row.slowest else ' '}{row.rank}", style=f"bold {mark}".strip()),
        "host": Text(row.host[:10] or NA, style="" if row.host else palette.muted),
        "gpu": Text(row.gpu, style="" if row.gpu.isdigit() else palette.muted),
        "step": Text(fmt_s(s.step_time_p50_s), style=mark or "", justify="right")
        if s.step_time_p50_s is not None
        else _na(palette),
        "samples": Text(fmt_rate(s.samples_per_s), justify="right") if s.samples_per_s is not None else _na(palette),
        # Thresholds as in the PyTorch profiler's old advice: loader > 5%, communication > 10% of the step.
        "loader": _frac_cell(s.loader_wait_frac, palette, 0.05, 0.20),
        "comm": _frac_cell(s.exposed_comm_frac, palette, 0.10, 0.30),
        "cpu": Text(fmt_pct(s.cpu_pct), justify="right") if s.cpu_pct is not None else _na(palette),
    }
    if s.forward_s is None and s.backward_s is None:
        cells["fwdbwd"] = _na(palette, "left")
    else:
        cells["fwdbwd"] = Text(f"{fmt_s(s.forward_s)}/{fmt_s(s.backward_s)}")
    if s.mem_allocated_bytes is None:
        cells["mem"] = _na(palette, "left")
    elif s.mem_total_bytes:
        near_full = s.mem_peak_bytes is not None and s.mem_peak_bytes > 0.95 * s.mem_total_bytes
        cells["mem"] = Text(
            f"{fmt_gib(s.mem_allocated_bytes)}/{fmt_gib(s.mem_total_bytes, digits=0)}G",
            style=palette.warn if near_full else "",
        )
    else:
        cells["mem"] = Text(fmt_bytes(s.mem_allocated_bytes))
    status_style = {LIVE: palette.ok, DONE: palette.muted}.get(row.status, f"bold {palette.bad}")
    cells["status"] = Text(row.status, style=status_style)
    return cells


class RanksTable(DataTable[Text]):
    """Every rank of every run; the app's ``s`` cycles the sort column; enter opens the rank."""

    sort_index: reactive[int] = reactive(0)
    """Which of SORT_KEYS orders the rows."""
    narrow: reactive[bool] = reactive(False)
    """Hide the secondary columns (host, fwd/bwd)."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        """Build an empty table; ``show`` fills it.

        Args:
            name: The widget's name.
            id: The widget's DOM id.
            classes: Space-separated CSS classes.
        """
        super().__init__(name=name, id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        self._rows: list[RankRow] = []
        self._order: list[str] = []
        self._cells: dict[str, dict[str, Text]] = {}
        self._columns: tuple[str, ...] = ()
        self._labelled_sort = -1
        self._palette = Palette()

    @property
    def sort_key(self) -> SortKey:
        return SORT_KEYS[self.sort_index]

    @property
    def selected_key(self) -> str | None:
        """The row key under the cursor."""
        if not self._order or not 0 <= self.cursor_row < len(self._order):
            return None
        return self._order[self.cursor_row]

    def on_resize(self) -> None:
        self.narrow = self.size.width < NARROW_BELOW

    def action_cycle_sort(self) -> None:
        self.sort_index = (self.sort_index + 1) % len(SORT_KEYS)

    def watch_sort_index(self) -> None:
        self._apply()

    def watch_narrow(self) -> None:
        self._apply()

    def show(self, rows: Sequence[RankRow], palette: Palette) -> None:
        """Show these rows, changing only the cells whose text changed."""
        self._rows = list(rows)
        self._palette = palette
        self._apply()

    def _wanted_columns(self) -> tuple[str, ...]:
        several_runs = len({r.run_id for r in self._rows}) > 1
        return tuple(c.key for c in COLUMNS if (c.narrow or not self.narrow) and (c.key != "run" or several_runs))

    def _apply(self) -> None:
        columns = self._wanted_columns()
        rows = sort_rows(self._rows, self.sort_key)
        order = [r.key for r in rows]
        keep = self.selected_key  # before clear(), which moves the cursor to the top
        if columns != self._columns or self.sort_index != self._labelled_sort:
            self._set_columns(columns)
        if order != self._order:
            self._rebuild(rows, keep)
            return
        for row in rows:
            new = row_cells(row, self._palette)
            old = self._cells.get(row.key, {})
            for column in columns:
                if old.get(column) != new[column]:
                    self.update_cell(row.key, column, new[column])
            self._cells[row.key] = new

    def _set_columns(self, columns: tuple[str, ...]) -> None:
        self.clear(columns=True)
        self._order = []
        self._columns = columns
        self._labelled_sort = self.sort_index
        sort_column = self.sort_key.column
        arrow = "↑" if not self.sort_key.descending else "↓"
        for column in COLUMNS:
            if column.key in columns:
                label = f"{column.label}{arrow}" if column.key == sort_column else column.label
                self.add_column(label, key=column.key, width=column.width)

    def _rebuild(self, rows: list[RankRow], keep: str | None) -> None:
        """New ranks, lost ones, or a new order: re-add the rows, keeping the cursor on its rank."""
        self.clear()
        self._cells = {}
        for row in rows:
            cells = row_cells(row, self._palette)
            self._cells[row.key] = cells
            self.add_row(*(cells[c] for c in self._columns), key=row.key)
        self._order = [r.key for r in rows]
        if keep in self._order:
            self.move_cursor(row=self._order.index(keep), animate=False)
