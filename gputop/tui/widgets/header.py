"""The one-line header: what is being watched, how it is going, and whether the view is frozen."""

from __future__ import annotations

from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget

from gputop.tui.format import fmt_pct, fmt_rate, fmt_small_frac, fmt_uptime, fmt_us
from gputop.tui.strips import Part, PartStyles, cells, draw
from gputop.tui.view import DashboardView


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
        self._view_parts: list[Part] = self._view_parts_of(None)
        self._styles = PartStyles(self)
        self._drawn: tuple[list[Part], int, Strip] | None = None  # the line drawn, and the parts and width it shows

    def show(self, view: DashboardView) -> None:
        """Show this view's figures, repainting only if the line they make changed."""
        parts = self._view_parts_of(view)
        if parts != self._view_parts:
            self._view_parts = parts
            self.refresh()

    @staticmethod
    def _cost(cpu_frac: float | None, hook_s: float | None) -> list[Part]:
        """gputop's own cost on its ranks, from their self-accounting: no peer shows its own."""
        if cpu_frac is None and hook_s is None:
            return []
        return [
            ("  gputop ", "$text-muted"),
            f"{fmt_small_frac(cpu_frac)} CPU",
            (" · ", "$text-muted"),
            fmt_us(hook_s),
            ("/step", "$text-muted"),
        ]

    @staticmethod
    def _hosts(view: DashboardView) -> list[Part]:
        return [f"  {view.hosts} hosts"] if view.hosts > 1 else []

    @classmethod
    def _view_parts_of(cls, view: DashboardView | None) -> list[Part]:
        """The header's left part that comes from the view, as (text, style) parts."""
        parts: list[Part] = []
        if view is None or view.empty:
            parts.append(("no run reporting", "$text-muted"))
        elif len(view.runs) == 1:
            run = view.runs[0]
            lost = run.reporting - run.live
            parts += [
                (run.name, "bold"),
                *cls._hosts(view),
                f"  {run.live}/{run.world_size} ranks",
                (f" ({lost} not live)", "$warning") if lost else "",
                f"  up {fmt_uptime(run.uptime_s)}",
                "  ",
                (fmt_rate(run.steps_per_s), "$text-muted" if run.steps_per_s is None else "bold"),
                " steps/s",
                *cls._cost(run.gputop_cost.cpu_frac, run.gputop_cost.hook_s_per_step),
                (f"  {run.job}", "$text-muted") if run.job else "",
            ]
        else:
            live = sum(r.live for r in view.runs)
            world = sum(r.world_size for r in view.runs)
            parts += [(f"{len(view.runs)} runs", "bold"), *cls._hosts(view), f"  {live}/{world} ranks"]
            oldest = max(view.runs, key=lambda r: r.uptime_s)
            parts.append(f"  up {fmt_uptime(oldest.uptime_s)}")
        if view is not None and not view.empty:
            gpus = len(view.gpu_rows)
            parts.append(f"  {gpus} GPU{'s' if gpus != 1 else ''}" if gpus else "")
        if view is not None and view.figures.dashboard_cpu_pct is not None:
            parts.append((f" · dashboard {fmt_pct(view.figures.dashboard_cpu_pct)} CPU", "$text-muted"))
        return parts

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
        """The whole line: what is watched on the left, the paused marker and the source on the right."""
        left: list[Part] = [("gputop", "bold $accent"), "  ", *self._view_parts]
        if self.figures_every_s is not None:
            left.append((f" · figures every {self.figures_every_s:g} s", "$warning"))
        right: list[Part] = []
        if self.finished:
            right.append(("■ replay finished ", "bold $warning"))
        if self.paused:
            behind = f" -{fmt_uptime(self.behind_s)}" if self.behind_s > 0 else ""
            right.append((f"⏸ PAUSED{behind} ", "reverse bold $warning"))
        right.append((self.source_text, "$text-muted"))
        gap = self.size.width - cells(left) - cells(right)
        if gap < 2:
            # Narrow: the paused marker must stay visible, the source description may go.
            right = right[:-1]
            gap = max(self.size.width - cells(left) - cells(right), 1)
        return [*left, " " * gap, *right]
