"""``gputop fleet``'s node screen: one node's exporter read directly, every 2 s: its ranks, GPUs and findings.

The fleet screen's figures are Prometheus's, a scrape interval old; this one
asks the node's exporter itself (``gputop.fleet.node``), off the UI thread, so a
user who found a slow rank sees its node as it is now.  If the exporter cannot
be read, one line says so and the last page read stays, marked with its age.
"""

from __future__ import annotations

import time
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Static
from textual.worker import Worker, WorkerState

from gputop.fleet.node import NodePage, read_node
from gputop.fleet.query import FleetError
from gputop.tui.fleet.cells import NODE_GPU_COLUMNS, NODE_RANK_COLUMNS, finding_line, node_gpu_cells, node_rank_cells
from gputop.tui.fleet.messages import NodeFailed, NodeRead
from gputop.tui.palette import Palette
from gputop.tui.titles import set_border_title

NODE_EVERY_S = 2.0
NOT_MEASURED = (
    "N/A: the exporter left the figure out because the rank does not measure it; "
    "`gputop attach` to that rank's collector says why"
)


class FleetNodeScreen(Screen[None]):
    """The node behind ``instance``; ``rank`` (run, rank), the one it was opened from, gets the cursor."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("r", "refresh_now", "Refresh"),
    ]

    def __init__(self, *, instance: str, url: str, rank: tuple[str, str] | None = None) -> None:
        """Open on one node.

        Args:
            instance: The node's exporter as Prometheus names it (host:port).
            url: Where its metrics page is (``gputop.fleet.node.metrics_url``).
            rank: The (run, rank) the user came from, put under the cursor.
        """
        super().__init__()
        self.instance = instance
        self.url = url
        self.rank = rank
        self.page: NodePage | None = None  # the last page read
        self.read_t: float | None = None  # when (time.monotonic())
        self.failure: str | None = None  # the last read's one-line error, None when it worked
        self._timer: Timer | None = None
        self._rank_keys: list[tuple[str, str]] = []  # (run, rank) of each row of the ranks table, in order

    def compose(self) -> ComposeResult:
        yield Static(id="node-title")
        yield Static(id="node-status")
        with Vertical(id="node-ranks-box"):
            yield DataTable(id="node-ranks", cursor_type="row", zebra_stripes=True)
        with Vertical(id="node-gpus-box"):
            yield DataTable(id="node-gpus", cursor_type="row", zebra_stripes=True)
        yield Static(id="node-findings")
        yield Static(Content.styled(NOT_MEASURED, "$text-muted"), id="node-na")  # shown when a rank has an N/A
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#node-ranks-box").border_title = "ranks"
        self.query_one("#node-gpus-box").border_title = "GPUs"
        self.query_one("#node-ranks", DataTable).add_columns(*NODE_RANK_COLUMNS)
        self.query_one("#node-gpus", DataTable).add_columns(*NODE_GPU_COLUMNS)
        self.query_one("#node-title", Static).update(
            Content.assemble(
                ("node ", "bold"), (self.instance, "bold $accent"), (f"  ·  {self.url}  ·  read every ", "$text-muted"),
                (f"{NODE_EVERY_S:g} s, from the exporter itself", "$text-muted"),
            )
        )  # fmt: skip
        self.set_interval(1.0, self._show_status)
        self._read()

    def action_refresh_now(self) -> None:
        self._read()

    @work(thread=True, exclusive=True, exit_on_error=False, group="node")
    def _read(self) -> None:
        """Read the exporter's page off the UI thread; the answer comes back as a message."""
        try:
            page = read_node(self.url)
        except FleetError as exc:
            self.post_message(NodeFailed(str(exc)))
            return
        self.post_message(NodeRead(page, time.monotonic()))

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_timer(NODE_EVERY_S, self._read)

    def on_node_read(self, message: NodeRead) -> None:
        self.page, self.read_t, self.failure = message.page, message.read_t, None
        self._show(message.page)
        self._show_status()
        self._schedule()

    def on_node_failed(self, message: NodeFailed) -> None:
        self.failure = message.reason
        self._show_status()
        self._schedule()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A read that raised what no read should (a bug, or a page cut short) is said, and reading goes on."""
        if event.worker.group == "node" and event.state == WorkerState.ERROR:
            self.post_message(NodeFailed(f"reading {self.url} failed: {event.worker.error!r}"))

    def _show(self, page: NodePage) -> None:
        palette = Palette.from_app(self.app)
        ranks = self.query_one("#node-ranks", DataTable)
        # The cursor stays on its rank across reads; before the first, it goes to the rank the user came from.
        shown = self._rank_keys
        keep = shown[ranks.cursor_row] if 0 <= ranks.cursor_row < len(shown) else self.rank
        self._rank_keys = [(rank.run, rank.rank) for rank in page.ranks]
        ranks.clear()
        for rank in page.ranks:
            ranks.add_row(*node_rank_cells(rank, palette))
        if keep in self._rank_keys:
            ranks.move_cursor(row=self._rank_keys.index(keep))
        gpus = self.query_one("#node-gpus", DataTable)
        gpus.clear()
        for gpu in page.gpus:
            gpus.add_row(*node_gpu_cells(gpu))
        none = "" if page.ranks else " · no rank reports to this exporter now"
        set_border_title(self.query_one("#node-ranks-box"), f"ranks ({len(page.ranks)}){none}")
        set_border_title(self.query_one("#node-gpus-box"), f"GPUs ({len(page.gpus)})")
        figures = ("step_s", "steps_per_s", "loader_wait", "exposed_comm")
        self.query_one("#node-na").display = any(getattr(r, f) is None for r in page.ranks for f in figures)
        title = Text(f"findings of the node's own gputop ({len(page.findings)})", style=f"bold {palette.accent}")
        lines = [finding_line(f, palette) for f in page.findings] or [Text("none at work", style=palette.muted)]
        self.query_one("#node-findings", Static).update(Text("\n").join([title, *lines]))

    def _show_status(self) -> None:
        """One line: when the page was read, or why it could not be (and how old what is shown is)."""
        status = self.query_one("#node-status", Static)
        age = None if self.read_t is None else time.monotonic() - self.read_t
        if self.failure is not None:
            shown = "nothing read yet" if age is None else f"showing what it said {age:.0f} s ago (stale)"
            status.update(Content.assemble((self.failure, "bold $error"), ("  ·  ", "$text-muted"), shown))
        elif age is None:
            status.update(Content.styled(f"reading {self.url} …", "$text-muted"))
        else:
            status.update(Content.styled(f"read {age:.0f} s ago", "$text-muted"))
        status.set_class(self.failure is not None, "-failed")
