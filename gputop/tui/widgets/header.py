"""The one-line header: what is being watched, how it is going, and whether the view is frozen."""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from gputop.diagnose.wording import hours_text
from gputop.tui.format import fmt_pct, fmt_rate, fmt_small_frac, fmt_uptime, fmt_us
from gputop.tui.strips import Part, PartStyles, cells, draw
from gputop.tui.view import DashboardView

Piece = tuple[int, tuple[Part, ...]]
"""Parts that show or give way together, and when they give way: 0 never, higher sooner."""

# On a narrow screen whole pieces give way, these first, rather than the line being cut
# mid-word at its end, where the paused marker is (at 80 columns a run's line is ~80 cells).
IDLE, SOURCE, DASHBOARD_CPU, JOB, COST, UPTIME, GPUS, HOSTS = 8, 7, 6, 5, 4, 3, 2, 1
KEEP = 0


class HeaderBar(Widget):
    """Runs, ranks, world size, uptime, steps/s, the source, and a paused marker."""

    DEFAULT_CSS = """
    HeaderBar {
        height: 1;
    }
    """

    paused: reactive[bool] = reactive(False)
    """The user froze the view with ``p``."""
    source_text: reactive[str] = reactive("")
    """Where the data comes from: "listening on …", "replay of run.jsonl"."""
    finished: reactive[bool] = reactive(False)
    """A replay reached the end of its recording."""
    behind_s: reactive[float] = reactive(0.0)
    """While paused: how far the view on screen is behind the newest (time travel)."""
    figures_every_s: reactive[float | None] = reactive(None)
    """Set when figures update less often than the refresh (many ranks): how often they do."""

    def __init__(
        self,
        *,
        source_text: str = "",
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        """Build the header.

        Args:
            source_text: What the source says about itself.
            name: The widget's name.
            id: The widget's DOM id.
            classes: Space-separated CSS classes.
        """
        super().__init__(name=name, id=id, classes=classes)
        self.source_text = source_text
        self._view_pieces: list[Piece] = self._view_pieces_of(None)
        self._styles = PartStyles(self)
        self._drawn: tuple[list[Part], int, Strip] | None = None  # the line drawn, and the parts and width it shows

    def show(self, view: DashboardView) -> None:
        """Show this view's figures, repainting only if the line they make changed."""
        pieces = self._view_pieces_of(view)
        if pieces != self._view_pieces:
            self._view_pieces = pieces
            self.refresh()

    @staticmethod
    def _cost(cpu_frac: float | None, hook_s: float | None) -> list[Piece]:
        """gputop's own cost on its ranks, from their self-accounting: no peer shows its own."""
        if cpu_frac is None and hook_s is None:
            return []
        parts: tuple[Part, ...] = (
            ("  gputop ", "$text-muted"),
            f"{fmt_small_frac(cpu_frac)} CPU",
            (" · ", "$text-muted"),
            fmt_us(hook_s),
            ("/step", "$text-muted"),
        )
        return [(COST, parts)]

    @staticmethod
    def _idle(idle: tuple[float, int] | None) -> list[Piece]:
        """The runs' idle GPU-hours every hour: what their GPUs hold and do not use, the waste in the units paid."""
        if idle is None:
            return []
        return [(IDLE, ((" · idle ", "$text-muted"), hours_text(idle[0]), (" GPU-h/h", "$text-muted")))]

    @staticmethod
    def _hosts(view: DashboardView) -> list[Piece]:
        return [(HOSTS, (f"  {view.hosts} hosts",))] if view.hosts > 1 else []

    @classmethod
    def _view_pieces_of(cls, view: DashboardView | None) -> list[Piece]:
        """The header's left part that comes from the view, in pieces that give way whole."""
        pieces: list[Piece] = []
        if view is None or view.empty:
            pieces.append((KEEP, (("no run reporting", "$text-muted"),)))
        elif len(view.runs) == 1:
            run = view.runs[0]
            lost = run.reporting - run.live
            steps_style = "$text-muted" if run.steps_per_s is None else "bold"
            pieces += [
                (KEEP, ((run.name, "bold"),)),
                *cls._hosts(view),
                (KEEP, (f"  {run.live}/{run.world_size} ranks", (f" ({lost} not live)", "$warning") if lost else "")),
                (UPTIME, (f"  up {fmt_uptime(run.uptime_s)}",)),
                (KEEP, ("  ", (fmt_rate(run.steps_per_s), steps_style), " steps/s")),
                *cls._cost(run.gputop_cost.cpu_frac, run.gputop_cost.hook_s_per_step),
            ]
            if run.job:
                pieces.append((JOB, ((f"  {run.job}", "$text-muted"),)))
        else:
            live = sum(r.live for r in view.runs)
            world = sum(r.world_size for r in view.runs)
            oldest = max(view.runs, key=lambda r: r.uptime_s)
            pieces += [
                (KEEP, ((f"{len(view.runs)} runs", "bold"),)),
                *cls._hosts(view),
                (KEEP, (f"  {live}/{world} ranks",)),
                (UPTIME, (f"  up {fmt_uptime(oldest.uptime_s)}",)),
            ]
        if view is not None and not view.empty and (gpus := len(view.gpu_rows)):
            pieces.append((GPUS, (f"  {gpus} GPU{'s' if gpus != 1 else ''}",)))
            pieces += cls._idle(view.idle_gpus)
        if view is not None and view.figures.dashboard_cpu_pct is not None:
            pieces.append(
                (DASHBOARD_CPU, ((f" · dashboard {fmt_pct(view.figures.dashboard_cpu_pct)} CPU", "$text-muted"),))
            )
        return pieces

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()  # a new theme: new colours
        self._drawn = None

    def render_line(self, y: int) -> Strip:
        parts, width = self._parts(), self.size.width
        drawn = self._drawn
        if drawn is None or drawn[0] != parts or drawn[1] != width:
            drawn = self._drawn = (parts, width, draw(parts, self._styles, width))
        return drawn[2]

    @property
    def text(self) -> str:
        """The line as plain text."""
        return self.render_line(0).text

    def _parts(self) -> list[Part]:
        """The whole line: what is watched on the left, the paused marker and the source on the right.

        Too wide for the screen, pieces give way whole, the source first (``SOURCE`` …
        ``HOSTS``); the run's name, its ranks, steps/s, how often figures update and
        the paused marker stay, and only they are ever cut.
        """
        left: list[Piece] = [(KEEP, (("gputop", "bold $accent"), "  ")), *self._view_pieces]
        if self.figures_every_s is not None:
            left.append((KEEP, ((f" · figures every {self.figures_every_s:g} s", "$warning"),)))
        right: list[Piece] = []
        if self.finished:
            right.append((KEEP, (" ", ("■ replay finished ", "bold $warning"))))
        if self.paused:
            behind = f" -{fmt_uptime(self.behind_s)}" if self.behind_s > 0 else ""
            right.append((KEEP, (" ", (f"⏸ PAUSED{behind} ", "reverse bold $warning"))))
        right.append((SOURCE, ("  ", (self.source_text, "$text-muted"))))
        pieces = [*left, *right]
        widths = [cells(parts) for _, parts in pieces]
        room = self.size.width
        shown = set(range(len(pieces)))
        while sum(widths[i] for i in shown) > room:
            give_way = max(shown, key=lambda i: (pieces[i][0], i))  # of the soonest to go, the rightmost
            if pieces[give_way][0] == KEEP:
                break
            shown.discard(give_way)
        kept_left = [part for i, (_, parts) in enumerate(left) if i in shown for part in parts]
        kept_right = [part for i, (_, parts) in enumerate(right, len(left)) if i in shown for part in parts]
        gap = room - cells(kept_left) - cells(kept_right)
        if gap < 0:  # what stays is still too wide: cut what is watched, never the paused marker
            return [*_cut(kept_left, max(room - cells(kept_right), 0)), *kept_right]
        return [*kept_left, " " * gap, *kept_right]


def _cut(parts: list[Part], width: int) -> list[Part]:
    """The parts cut to ``width`` cells."""
    kept: list[Part] = []
    room = width
    for part in parts:
        text, style = (part, "") if isinstance(part, str) else part
        n = cell_len(text)
        if n > room:
            if room:
                cut = set_cell_size(text, room)
                kept.append((cut, style) if style else cut)
            break
        kept.append(part)
        room -= n
    return kept
