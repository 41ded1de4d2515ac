"""What the ranks table shows, before any drawing: its rows in order, the hosts folded, the columns, the cells.

Plain data over ``RankRow``/``HostRow`` and Rich ``Text``, no widget: the
ranks table (``ranks_table.RanksTable``) arranges a layout when rows, sort,
width or folds change, then asks it for the row at each screen line.  A row's
cells are built once per refresh, kept by the entry they came from (by
identity), so a sort or a fold reuses them, and carry a content key, so the
table can cache the rendered line by what it shows.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from rich.text import Text

from gputop.tui.palette import Palette
from gputop.tui.view import HostRow, RankRow
from gputop.tui.widgets.rank_cells import (
    COLUMNS,
    FOLD_ABOVE,
    GROUPED_RANK_WIDTH,
    NO_HIGHLIGHT,
    Entry,
    Highlight,
    SortKey,
    highlighted,
    host_cells,
    ordered_entries,
    row_cells,
)

CELL_PADDING = 1  # blank cells each side of a column, as a DataTable draws them
CellsKey = tuple[Hashable, ...]


def text_key(text: Text) -> Hashable:
    """What a cell shows, as a hashable value: two cells with equal keys draw the same."""
    return (text.plain, str(text.style), tuple(text.spans), text.justify)


class RanksLayout:
    """The table's rows (``entries``, folded ranks left out), ``columns`` with their ``widths``, and ``header``."""

    def __init__(self) -> None:
        self.rows: list[RankRow] = []
        self.hosts: list[HostRow] = []
        self.entries: list[Entry] = []  # the rows in order, folded ranks left out
        self.order: list[str] = []  # their keys
        self.index: dict[str, int] = {}  # key -> position in order
        self.columns: tuple[str, ...] = ()
        self.widths: tuple[int, ...] = ()  # each column's width with its padding
        self.header: tuple[Text, ...] = ()
        self.palette = Palette()
        self.highlight = NO_HIGHLIGHT
        self.fold_by_default = False
        self._unfolded: set[str] = set()  # host keys opened by the user
        self._folded: set[str] = set()  # host keys closed by the user
        # Per row key: the entry its cells were built from (by identity), its fold, the cells, their key.
        self._cells: dict[str, tuple[Entry, bool, Palette, Highlight, dict[str, Text], CellsKey]] = {}

    def set_rows(
        self, rows: Sequence[RankRow], hosts: Sequence[HostRow], palette: Palette, highlight: Highlight
    ) -> None:
        """New rows (``arrange`` lays them out)."""
        self.rows = list(rows)
        self.hosts = list(hosts)
        self.fold_by_default = len(rows) > FOLD_ABOVE
        self.palette = palette
        self.highlight = highlight

    # -- folding -----------------------------------------------------------------

    @property
    def grouped(self) -> bool:
        """Ranks sit under host rows: some run has ranks on several hosts."""
        return len(self.hosts) > len({h.run_id for h in self.hosts})

    @property
    def all_folded(self) -> bool:
        return all(self.is_folded(h.key) for h in self.hosts)

    def is_folded(self, host_key: str) -> bool:
        if host_key in self._unfolded:
            return False
        return host_key in self._folded or self.fold_by_default

    def toggle_fold(self, host_key: str) -> None:
        """Open a folded host or fold an open one."""
        if self.is_folded(host_key):
            self._folded.discard(host_key)
            self._unfolded.add(host_key)
        else:
            self._unfolded.discard(host_key)
            self._folded.add(host_key)

    def set_all_folded(self, folded: bool) -> None:
        """Fold or open every host."""
        keys = {h.key for h in self.hosts}
        if folded:
            self._folded |= keys
            self._unfolded -= keys
        else:
            self._unfolded |= keys
            self._folded -= keys

    # -- layout ------------------------------------------------------------------

    def arrange(self, sort_key: SortKey, narrow: bool, roomy: bool = False) -> None:
        """Choose the columns for the width and order the rows under their hosts."""
        self._set_columns(sort_key, narrow, roomy)
        self.entries = ordered_entries(self.rows, self.hosts, sort_key, self.grouped, self.is_folded)
        self.order = [e.key for e in self.entries]
        self.index = {key: i for i, key in enumerate(self.order)}
        if len(self._cells) > 2 * len(self.order) + 256:  # rows that left: forget their cells
            self._cells = {k: v for k, v in self._cells.items() if k in self.index}

    def _wanted_columns(self, narrow: bool, roomy: bool = False) -> tuple[str, ...]:
        several_runs = len({r.run_id for r in self.rows}) > 1
        # Grouped by host, the rank column names the hosts (and carries the fold marks): no host
        # column; narrow, samples/s gives way (the run chart shows the throughput).
        hidden = {"host", "samples"} if (self.grouped and narrow) else {"host"} if self.grouped else set()
        return tuple(
            c.key
            for c in COLUMNS
            if (c.narrow if narrow else c.wide)
            and (roomy or not c.roomy)
            and (c.key != "run" or several_runs)
            and c.key not in hidden
        )

    def _set_columns(self, sort_key: SortKey, narrow: bool, roomy: bool) -> None:
        columns = self._wanted_columns(narrow, roomy)
        sort_column = sort_key.column
        arrow = "↑" if not sort_key.descending else "↓"
        header, widths = [], []
        for column in COLUMNS:
            if column.key in columns:
                label = Text(f"{column.label}{arrow}" if column.key == sort_column else column.label)
                if column.key in self.highlight.columns:
                    label.stylize(f"underline {self.highlight.style}")
                header.append(label)
                width = GROUPED_RANK_WIDTH if (column.key == "rank" and self.grouped) else column.width
                widths.append(width + 2 * CELL_PADDING)
        self.columns, self.header, self.widths = columns, tuple(header), tuple(widths)

    def cursor_after(self, keep: str | None, cursor: int) -> int:
        """The cursor stays on its row when rows move; on a folded rank, it goes to the rank's host."""
        if keep in self.index:
            return self.index[keep]
        if keep is not None and not keep.startswith("host:"):
            host = next((h.key for h in self.hosts if any(r.key == keep for r in h.ranks)), None)
            if host in self.index:
                return self.index[host]
        return max(min(cursor, len(self.order) - 1), 0)

    # -- cells -------------------------------------------------------------------

    def cells_of(self, index: int) -> tuple[dict[str, Text], CellsKey]:
        """The cells of the row at ``index`` and their content key, built once per row and refresh."""
        entry = self.entries[index]
        folded = isinstance(entry, HostRow) and self.is_folded(entry.key)
        cached = self._cells.get(entry.key)
        highlight = self.highlight
        if cached is not None and cached[0] is entry and cached[1:4] == (folded, self.palette, highlight):
            return cached[4], cached[5]
        if isinstance(entry, HostRow):
            cells = host_cells(entry, folded, self.palette)
            marked = any(r.key in highlight.rank_keys for r in entry.ranks)
        else:
            cells = row_cells(entry, self.palette)
            if self.grouped:  # indented under its host's row
                cells["rank"] = Text("  ") + cells["rank"]
            marked = entry.key in highlight.rank_keys
        if marked:
            cells = highlighted(cells, highlight)
        key = tuple(text_key(t) for t in cells.values())
        self._cells[entry.key] = (entry, folded, self.palette, highlight, cells, key)
        return cells, key
