"""The ranks table: one row per rank with its step as a stacked bar, grouped by run and host.

Ranks on several hosts fold under one summary row per host (folded by default
past ``FOLD_ABOVE`` ranks), so a 1,024-rank job is 128 rows until a host is
opened.  Which rows, in what order, with which columns and cells is the
layout's (``ranks_layout.RanksLayout``, plain data); this widget draws it,
moves the cursor over it and answers keys and clicks.

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
from gputop.tui.widgets.rank_cells import NARROW_BELOW, NO_HIGHLIGHT, ROOMY_FROM, SORT_KEYS, Highlight, SortKey
from gputop.tui.widgets.ranks_layout import CELL_PADDING, RanksLayout, text_key

# Rendered lines kept: every row on a tall screen in its three looks (even, odd, cursor), with room.
LINE_CACHE_MAX = 1024


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
    roomy: reactive[bool] = reactive(False)  # room for every column: the work a step does in full
    """Hide the secondary columns (host, CPU%) and draw the phase bar short."""

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        """Build an empty table; ``show`` fills it.

        Args:
            name: The widget's name.
            id: The widget's DOM id.
            classes: Space-separated CSS classes.
        """
        super().__init__(name=name, id=id, classes=classes)
        self._layout = RanksLayout()
        self._cursor = 0
        self._highlighted: str | None = None  # the key last announced with RowHighlighted
        self._segments: dict[tuple[Hashable, tuple[int, ...]], list[Segment]] = {}  # a row's cells, unstyled
        self._lines: dict[Hashable, Strip] = {}  # finished lines, by content, look, width and scroll
        self._drawn: dict[int, Hashable] = {}  # screen line -> what render_line drew there
        self._looks: dict[str, Style] | None = None

    # -- what the app reads ------------------------------------------------------

    @property
    def sort_key(self) -> SortKey:
        return SORT_KEYS[self.sort_index]

    @property
    def row_count(self) -> int:
        return len(self._layout.entries)

    @property
    def selected_key(self) -> str | None:
        """The row key under the cursor (a rank's "run:rank", or a host's "host:run:name")."""
        order = self._layout.order
        if not 0 <= self._cursor < len(order):
            return None
        return order[self._cursor]

    @property
    def all_folded(self) -> bool:
        return self._layout.all_folded

    def get_column_index(self, column: str) -> int:
        """Where a column (by key: "mem", "step", ...) is among the columns shown."""
        return self._layout.columns.index(column)

    def get_row_at(self, index: int) -> list[Text]:
        """The cells of one row, in the columns shown."""
        cells = self._layout.cells_of(index)[0]
        return [cells[c] for c in self._layout.columns]

    # -- folding and sorting -----------------------------------------------------

    def toggle_fold(self, host_key: str) -> None:
        """Open a folded host or fold an open one."""
        self._layout.toggle_fold(host_key)
        self._apply()

    def set_all_folded(self, folded: bool) -> None:
        """Fold or open every host."""
        self._layout.set_all_folded(folded)
        self._apply()

    def action_cycle_sort(self) -> None:
        self.sort_index = (self.sort_index + 1) % len(SORT_KEYS)

    def watch_sort_index(self) -> None:
        self._apply()

    def watch_narrow(self) -> None:
        self._apply()

    def watch_roomy(self) -> None:
        self._apply()

    def on_resize(self) -> None:
        self.narrow = self.size.width < NARROW_BELOW
        self.roomy = self.size.width >= ROOMY_FROM
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
        self._layout.set_rows(rows, hosts, palette, highlight)
        self._apply()

    def _apply(self) -> None:
        """Lay out the rows again; redraw the screen lines that now show something else."""
        keep = self.selected_key
        layout = self._layout
        layout.arrange(self.sort_key, self.narrow, self.roomy)
        self._cursor = layout.cursor_after(keep, self._cursor)
        self.virtual_size = Size(sum(layout.widths), len(layout.entries) + 1)  # + the header line
        self._scroll_to_cursor()
        self._refresh_changed_lines()
        self._announce_cursor()

    # -- drawing ---------------------------------------------------------------

    def _line_key(self, y: int) -> Hashable:
        """What screen line ``y`` should show: the header, or a row's content in its look."""
        layout = self._layout
        if y == 0:
            return ("header", tuple(text_key(t) for t in layout.header), layout.widths)
        index = y - 1 + self.scroll_offset.y
        if index >= len(layout.entries):
            return ("blank",)
        content = layout.cells_of(index)[1]
        look = "cursor" if index == self._cursor else ("even" if index % 2 == 0 else "odd")
        return (content, layout.columns, layout.widths, look)

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
        widths = self._layout.widths
        key = (content, widths)
        segments = self._segments.get(key)
        if segments is None:
            if len(self._segments) > LINE_CACHE_MAX:
                self._segments.clear()
            console = self.app.console
            options = self.app.console_options.update(no_wrap=True)
            segments = []
            for cell, width in zip(cells, widths, strict=True):
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
        layout = self._layout
        if y == 0:
            row_style, cursor, post = looks["header"], Style(), Style()
            cells, content = list(layout.header), line_key
        else:
            index = y - 1 + self.scroll_offset.y
            row_cells, content = layout.cells_of(index)
            cells = [row_cells[c] for c in layout.columns]
            row_style = looks["even" if index % 2 == 0 else "odd"]
            at_cursor = index == self._cursor
            cursor = looks["cursor"] if at_cursor else Style()
            post = Style.from_color(color=cursor.color) if at_cursor else Style()  # the cursor's text colour wins
        scroll_x = self.scroll_offset.x
        cache_key = (content, layout.widths, row_style, cursor, post, base, width, scroll_x)
        strip = self._lines.get(cache_key)
        if strip is None:
            if len(self._lines) > LINE_CACHE_MAX:
                self._lines.clear()
            pre = row_style + cursor
            segments = list(Segment.apply_style(self._row_segments(cells, content), pre, post))
            table_width = sum(layout.widths)
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
        rows = len(self._layout.order)
        if not rows:
            return
        row = max(0, min(row, rows - 1))
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
        self.move_cursor(len(self._layout.order) - 1)

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
            for column, width in zip(self._layout.columns, self._layout.widths, strict=True):
                if x < width:
                    self._sort_by(column)
                    return
                x -= width
            return
        index = offset.y - 1 + self.scroll_offset.y
        if index < len(self._layout.order):
            if index == self._cursor:
                self.action_select_cursor()
            self.move_cursor(index)

    def _sort_by(self, column: str) -> None:
        index = next((i for i, key in enumerate(SORT_KEYS) if key.column == column), None)
        if index is not None and index != self.sort_index:
            self.sort_index = index
            self.post_message(SortChanged())
