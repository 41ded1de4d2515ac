"""The ranks table: one row per rank with its step as a stacked bar, grouped by run and host.

Ranks on several hosts fold under one summary row per host (folded by default
past ``FOLD_ABOVE`` ranks), so a 1,024-rank job is 128 rows until a host is
opened.

A Line-API widget (Textual's ``ScrollView`` with ``render_line``) rather than a
``DataTable``, whose cell cache is keyed on an update counter: one changed cell
re-rendered every visible cell, ~2.5 ms a row, and a sort or a fold rebuilt
every row.  Here the cost of a refresh follows the rows on screen whose text
changed: cells are built only for the rows on screen, a row's rendering is
cached by its cells' content (so a sort or a fold re-orders cached lines),
and only the screen lines whose row, content or cursor changed are redrawn.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import ClassVar

from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gputop.tui.messages import RowHighlighted, RowSelected, SortChanged
from gputop.tui.palette import Palette
from gputop.tui.view import HostRow, RankRow
from gputop.tui.widgets.rank_cells import (
    COLUMNS,
    FOLD_ABOVE,
    GROUPED_RANK_WIDTH,
    NARROW_BELOW,
    NO_HIGHLIGHT,
    SORT_KEYS,
    Entry,
    Highlight,
    SortKey,
    highlighted,
    host_cells,
    ordered_entries,
    row_cells,
)

# Re-exported: the figures test reads a rank's cells from here.
__all__ = ["NARROW_BELOW", "SORT_KEYS", "RanksTable", "host_cells", "row_cells"]

CELL_PADDING = 1  # blank cells each side of a column, as a DataTable draws them
CellsKey = tuple[Hashable, ...]
# Rendered lines kept: every row on a tall screen in its three looks (even, odd, cursor), with room.
LINE_CACHE_MAX = 1024


def _text_key(text: Text) -> Hashable:
    """What a cell shows, as a hashable value: two cells with equal keys draw the same."""
    return (text.plain, str(text.style), tuple(text.spans), text.justify)


class RanksTable(ScrollView, can_focus=True):
    """Every rank of every run; the app's ``s`` cycles the sort column; enter opens a rank or folds a host."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "Select", show=False),
        Binding("up", "cursor_up", "Cursor up", show=False),
        Binding("down", "cursor_down", "Cursor down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
        Binding("home,ctrl+home", "first", "First row", show=False),
        Binding("end,ctrl+end", "last", "Last row", show=False),
    ]

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "ranks-table--header",
        "ranks-table--cursor",
        "ranks-table--even-row",
        "ranks-table--odd-row",
    }

    sort_index: reactive[int] = reactive(0)
    """Which of SORT_KEYS orders the rows."""
    narrow: reactive[bool] = reactive(False)
    """Hide the secondary columns (host, CPU%) and draw the phase bar short."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        """Build an empty table; ``show`` fills it.

        Args:
            name: The widget's name.
            id: The widget's DOM id.
            classes: Space-separated CSS classes.
        """
        super().__init__(name=name, id=id, classes=classes)
        self._rows: list[RankRow] = []
        self._hosts: list[HostRow] = []
        self._entries: list[Entry] = []  # the rows in order, folded ranks left out
        self._order: list[str] = []  # their keys
        self._index: dict[str, int] = {}  # key -> position in _order
        self._columns: tuple[str, ...] = ()
        self._widths: tuple[int, ...] = ()  # each column's width with its padding
        self._header: tuple[Text, ...] = ()
        self._palette = Palette()
        self._highlight = NO_HIGHLIGHT
        self._unfolded: set[str] = set()  # host keys opened by the user
        self._folded: set[str] = set()  # host keys closed by the user
        self.fold_by_default = False
        self._cursor = 0
        self._highlighted: str | None = None  # the key last announced with RowHighlighted
        # Per row key: the entry its cells were built from (by identity), its fold, the cells, their key.
        self._cells: dict[str, tuple[Entry, bool, Palette, Highlight, dict[str, Text], CellsKey]] = {}
        self._segments: dict[tuple[Hashable, tuple[int, ...]], list[Segment]] = {}  # a row's cells, unstyled
        self._lines: dict[Hashable, Strip] = {}  # finished lines, by content, look, width and scroll
        self._drawn: dict[int, Hashable] = {}  # screen line -> what render_line drew there
        self._looks: dict[str, Style] | None = None

    # -- what the app reads ------------------------------------------------------

    @property
    def sort_key(self) -> SortKey:
        return SORT_KEYS[self.sort_index]

    @property
    def cursor_row(self) -> int:
        return self._cursor

    @property
    def row_count(self) -> int:
        return len(self._entries)

    @property
    def selected_key(self) -> str | None:
        """The row key under the cursor (a rank's "run:rank", or a host's "host:run:name")."""
        if not 0 <= self._cursor < len(self._order):
            return None
        return self._order[self._cursor]

    @property
    def grouped(self) -> bool:
        return len(self._hosts) > len({h.run_id for h in self._hosts})

    @property
    def all_folded(self) -> bool:
        return all(self.is_folded(h.key) for h in self._hosts)

    def get_column_index(self, column: str) -> int:
        """Where a column (by key: "mem", "step", ...) is among the columns shown."""
        return self._columns.index(column)

    def get_row_at(self, index: int) -> list[Text]:
        """The cells of one row, in the columns shown."""
        cells = self._cells_of(index)[0]
        return [cells[c] for c in self._columns]

    # -- folding and sorting -----------------------------------------------------

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
        self._apply()

    def set_all_folded(self, folded: bool) -> None:
        """Fold or open every host."""
        keys = {h.key for h in self._hosts}
        if folded:
            self._folded |= keys
            self._unfolded -= keys
        else:
            self._unfolded |= keys
            self._folded -= keys
        self._apply()

    def action_cycle_sort(self) -> None:
        self.sort_index = (self.sort_index + 1) % len(SORT_KEYS)

    def watch_sort_index(self) -> None:
        self._apply()

    def watch_narrow(self) -> None:
        self._apply()

    def on_resize(self) -> None:
        self.narrow = self.size.width < NARROW_BELOW
        self._lines.clear()  # lines are cut to the width
        self._scroll_to_cursor()

    # -- data ------------------------------------------------------------------

    def show(
        self,
        rows: Sequence[RankRow],
        palette: Palette,
        hosts: Sequence[HostRow] = (),
        highlight: Highlight = NO_HIGHLIGHT,
    ) -> None:
        """Show these rows (under these host rows when there are several hosts), redrawing only what changed.

        ``highlight``: the ranks and columns the top finding's evidence reads, underlined.
        """
        self._rows = list(rows)
        self._hosts = list(hosts)
        self.fold_by_default = len(rows) > FOLD_ABOVE
        self._palette = palette
        self._highlight = highlight
        self._apply()

    def _wanted_columns(self) -> tuple[str, ...]:
        several_runs = len({r.run_id for r in self._rows}) > 1
        # Grouped by host, the rank column names the hosts (and carries the fold marks): no host
        # column; narrow, samples/s gives way (the run chart shows the throughput).
        hidden = {"host", "samples"} if (self.grouped and self.narrow) else {"host"} if self.grouped else set()
        return tuple(
            c.key
            for c in COLUMNS
            if (c.narrow if self.narrow else c.wide) and (c.key != "run" or several_runs) and c.key not in hidden
        )

    def _apply(self) -> None:
        """Lay out the rows again; redraw the screen lines that now show something else."""
        keep = self.selected_key
        self._set_columns()
        self._entries = ordered_entries(self._rows, self._hosts, self.sort_key, self.grouped, self.is_folded)
        self._order = [e.key for e in self._entries]
        self._index = {key: i for i, key in enumerate(self._order)}
        if len(self._cells) > 2 * len(self._order) + 256:  # rows that left: forget their cells
            self._cells = {k: v for k, v in self._cells.items() if k in self._index}
        self._cursor = self._cursor_after(keep)
        self.virtual_size = Size(sum(self._widths), len(self._entries) + 1)  # + the header line
        self._scroll_to_cursor()
        self._refresh_changed_lines()
        self._announce_cursor()

    def _set_columns(self) -> None:
        columns = self._wanted_columns()
        sort_column = self.sort_key.column
        arrow = "↑" if not self.sort_key.descending else "↓"
        header, widths = [], []
        for column in COLUMNS:
            if column.key in columns:
                label = Text(f"{column.label}{arrow}" if column.key == sort_column else column.label)
                if column.key in self._highlight.columns:
                    label.stylize(f"underline {self._highlight.style}")
                header.append(label)
                width = GROUPED_RANK_WIDTH if (column.key == "rank" and self.grouped) else column.width
                widths.append(width + 2 * CELL_PADDING)
        self._columns, self._header, self._widths = columns, tuple(header), tuple(widths)

    def _cursor_after(self, keep: str | None) -> int:
        """The cursor stays on its row when rows move; on a folded rank, it goes to the rank's host."""
        if keep in self._index:
            return self._index[keep]
        if keep is not None and not keep.startswith("host:"):
            host = next((h.key for h in self._hosts if any(r.key == keep for r in h.ranks)), None)
            if host in self._index:
                return self._index[host]
        return max(min(self._cursor, len(self._order) - 1), 0)

    def _cells_of(self, index: int) -> tuple[dict[str, Text], CellsKey]:
        """The cells of the row at ``index`` and their content key, built once per row and refresh."""
        entry = self._entries[index]
        folded = isinstance(entry, HostRow) and self.is_folded(entry.key)
        cached = self._cells.get(entry.key)
        highlight = self._highlight
        if cached is not None and cached[0] is entry and cached[1:4] == (folded, self._palette, highlight):
            return cached[4], cached[5]
        if isinstance(entry, HostRow):
            cells = host_cells(entry, folded, self._palette)
            marked = any(r.key in highlight.rank_keys for r in entry.ranks)
        else:
            cells = row_cells(entry, self._palette)
            if self.grouped:  # indented under its host's row
                cells["rank"] = Text("  ") + cells["rank"]
            marked = entry.key in highlight.rank_keys
        if marked:
            cells = highlighted(cells, highlight)
        key = tuple(_text_key(t) for t in cells.values())
        self._cells[entry.key] = (entry, folded, self._palette, highlight, cells, key)
        return cells, key

    # -- drawing ---------------------------------------------------------------

    def _line_key(self, y: int) -> Hashable:
        """What screen line ``y`` should show: the header, or a row's content in its look."""
        if y == 0:
            return ("header", tuple(_text_key(t) for t in self._header), self._widths)
        index = y - 1 + self.scroll_offset.y
        if index >= len(self._entries):
            return ("blank",)
        content = self._cells_of(index)[1]
        look = "cursor" if index == self._cursor else ("even" if index % 2 == 0 else "odd")
        return (content, self._columns, self._widths, look)

    def _refresh_changed_lines(self) -> None:
        if not self._drawn:  # nothing drawn yet: the first paint draws everything
            self.refresh()
            return
        width = max(self.virtual_size.width, self.size.width)
        for y in range(self.size.height):
            if self._drawn.get(y) != self._line_key(y):
                self.refresh(Region(0, y, width, 1))

    def _row_segments(self, cells: Sequence[Text], content: Hashable) -> list[Segment]:
        """One row's cells rendered side by side, padded to their columns, unstyled by row or cursor."""
        key = (content, self._widths)
        segments = self._segments.get(key)
        if segments is None:
            if len(self._segments) > LINE_CACHE_MAX:
                self._segments.clear()
            console = self.app.console
            options = self.app.console_options.update(no_wrap=True)
            segments = []
            for cell, width in zip(cells, self._widths, strict=True):
                # A header with its sort arrow may be a cell wider than its column: the arrow takes the right padding.
                right = CELL_PADDING if cell.cell_len <= width - 2 * CELL_PADDING else 0
                rendered = console.render_lines(
                    Padding(cell, (0, right, 0, CELL_PADDING)), options.update_dimensions(width, 1), pad=True
                )
                segments += rendered[0]
            self._segments[key] = segments
        return segments

    def render_lines(self, crop: Region) -> list[Strip]:
        self._looks = None  # read the styles once a paint: focus or theme may have changed them
        return super().render_lines(crop)

    def _look(self) -> dict[str, Style]:
        """The widget's and its rows' styles (each a CSS look-up that costs more than drawing a cached line)."""
        if self._looks is None:
            style = self.get_component_rich_style
            self._looks = {
                "base": self.rich_style,
                "header": style("ranks-table--header"),
                "even": style("ranks-table--even-row"),
                "odd": style("ranks-table--odd-row"),
                "cursor": style("ranks-table--cursor"),
            }
        return self._looks

    def render_line(self, y: int) -> Strip:
        line_key = self._line_key(y)
        self._drawn[y] = line_key
        width = self.size.width
        looks = self._look()
        base = looks["base"]
        if line_key == ("blank",):
            return Strip.blank(width, base)
        if y == 0:
            row_style, cursor, post = looks["header"], Style(), Style()
            cells, content = list(self._header), line_key
        else:
            index = y - 1 + self.scroll_offset.y
            row_cells_, content = self._cells_of(index)
            cells = [row_cells_[c] for c in self._columns]
            row_style = looks["even" if index % 2 == 0 else "odd"]
            at_cursor = index == self._cursor
            cursor = looks["cursor"] if at_cursor else Style()
            post = Style.from_color(color=cursor.color) if at_cursor else Style()  # the cursor's text colour wins
        scroll_x = self.scroll_offset.x
        cache_key = (content, self._widths, row_style, cursor, post, base, width, scroll_x)
        strip = self._lines.get(cache_key)
        if strip is None:
            if len(self._lines) > LINE_CACHE_MAX:
                self._lines.clear()
            pre = row_style + cursor
            segments = list(Segment.apply_style(self._row_segments(cells, content), pre, post))
            table_width = sum(self._widths)
            segments.append(Segment(" " * max(0, width - table_width), pre))  # the row's look to the edge
            strip = Strip(segments).crop(scroll_x, scroll_x + width).adjust_cell_length(width, base).simplify()
            self._lines[cache_key] = strip
        return strip

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._lines.clear()
        self._drawn.clear()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self._drawn.clear()  # every line moved

    # -- cursor ----------------------------------------------------------------

    def move_cursor(self, row: int) -> None:
        """Put the cursor on row ``row`` (clamped), scrolled into view."""
        if not self._order:
            return
        row = max(0, min(row, len(self._order) - 1))
        if row == self._cursor:
            return
        self._cursor = row
        self._scroll_to_cursor()
        self._refresh_changed_lines()
        self._announce_cursor()

    def _scroll_to_cursor(self) -> None:
        rows_shown = max(self.size.height - 1, 1)  # under the header
        top = int(self.scroll_offset.y)
        if self._cursor < top:
            self.scroll_to(y=self._cursor, animate=False)
        elif self._cursor > top + rows_shown - 1:
            self.scroll_to(y=self._cursor - rows_shown + 1, animate=False)

    def _announce_cursor(self) -> None:
        key = self.selected_key
        if key is not None and key != self._highlighted:
            self._highlighted = key
            self.post_message(RowHighlighted(key))

    def action_cursor_up(self) -> None:
        self.move_cursor(self._cursor - 1)

    def action_cursor_down(self) -> None:
        self.move_cursor(self._cursor + 1)

    def action_page_up(self) -> None:
        self.move_cursor(self._cursor - max(self.size.height - 1, 1))

    def action_page_down(self) -> None:
        self.move_cursor(self._cursor + max(self.size.height - 1, 1))

    def action_first(self) -> None:
        self.move_cursor(0)

    def action_last(self) -> None:
        self.move_cursor(len(self._order) - 1)

    def action_select_cursor(self) -> None:
        key = self.selected_key
        if key is not None:
            self.post_message(RowSelected(key))

    def on_click(self, event: events.Click) -> None:
        """A click on a row puts the cursor there, a click on the cursor's row opens it (as enter does);
        a click on a column's header sorts by that column."""
        offset = event.get_content_offset(self)
        if offset is None:
            return
        event.stop()
        if offset.y == 0:
            x = offset.x + self.scroll_offset.x
            for column, width in zip(self._columns, self._widths, strict=True):
                if x < width:
                    self._sort_by(column)
                    return
                x -= width
            return
        index = offset.y - 1 + self.scroll_offset.y
        if index < len(self._order):
            if index == self._cursor:
                self.action_select_cursor()
            self.move_cursor(index)

    def _sort_by(self, column: str) -> None:
        index = next((i for i, key in enumerate(SORT_KEYS) if key.column == column), None)
        if index is not None and index != self.sort_index:
            self.sort_index = index
            self.post_message(SortChanged())
