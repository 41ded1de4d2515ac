"""A step split into its phases, as one stacked bar with a legend."""

from __future__ import annotations

from collections.abc import Collection

from textual.app import RenderResult
from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

from gputop.combine import PHASES as PHASE_LIST
from gputop.model.figures import PHASES, Phase
from gputop.tui.format import NA, fmt_s
from gputop.tui.palette import GREY, Palette

# Theme variables (gputop.combine.PHASES), so the phases stay distinguishable on light and dark themes.
PHASE_STYLES: dict[Phase, str] = {p.name: f"${p.theme}" if p.theme else GREY for p in PHASE_LIST}
PHASE_LABELS: dict[Phase, str] = {p.name: p.name.replace("_", " ") for p in PHASE_LIST}
LEGEND_LABELS: dict[Phase, str] = {p.name: p.short for p in PHASE_LIST}
OPTIONAL = frozenset(p.name for p in PHASE_LIST if p.optional)


def phase_legend(palette: Palette, shown: Collection[Phase] = ()) -> Content:
    """The colours of the table's phase bars, in their order: "■load ■fwd ■bwd ■comm ■other".

    ``shown``: the phases some bar holds; an optional phase no rank measures (the optimizer's,
    from older reporters) is left out, so the legend names only colours on screen.
    """
    parts: list[tuple[str, str] | str] = []
    for phase in PHASES:
        if phase in OPTIONAL and phase not in shown:
            continue
        parts += [("■", palette.phase(phase)), f"{LEGEND_LABELS.get(phase, phase)} "]
    return Content.assemble(*parts).rstrip()


class PhaseBar(Widget):
    """Loader / forward / backward / exposed comm / other, per step, as a stacked bar."""

    DEFAULT_CSS = """
    PhaseBar {
        height: 3;
    }
    """

    phases: reactive[tuple[tuple[Phase, float | None], ...]] = reactive(())
    """(phase, seconds per step) in order; None = not measured."""

    def __init__(
        self,
        *,
        phases: tuple[tuple[Phase, float | None], ...] = (),
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        """Build the bar.

        Args:
            phases: Initial (phase, seconds) pairs.
            name: The widget's name.
            id: The widget's DOM id.
            classes: Space-separated CSS classes.
        """
        super().__init__(name=name, id=id, classes=classes)
        self.set_reactive(PhaseBar.phases, phases)

    def render(self) -> RenderResult:
        width = max(self.size.width, 10)
        known = [(name, s) for name, s in self.phases if s is not None and s > 0]
        total = sum(s for _, s in known)
        if total <= 0:
            bar = Content.styled("no step timed yet" if not self.phases else "·" * width, "$text-muted")
        else:
            parts: list[tuple[str, str]] = []
            used = 0
            for i, (name, seconds) in enumerate(known):
                cells = width - used if i == len(known) - 1 else round(seconds / total * width)
                used += cells
                parts.append(("█" * cells, PHASE_STYLES.get(name, "")))
            bar = Content.assemble(*parts)
        legend: list[str | tuple[str, str]] = []
        for name, phase_s in self.phases:
            share = f" {phase_s / total * 100:.0f}%" if (phase_s is not None and total > 0) else ""
            legend += [("■ ", PHASE_STYLES.get(name, "")), f"{PHASE_LABELS.get(name, name)} "]
            legend.append((fmt_s(phase_s) if phase_s is not None else NA, "" if phase_s is not None else "$text-muted"))
            legend.append(f"{share}   ")
        missing = [PHASE_LABELS.get(name, name) for name, phase_s in self.phases if phase_s is None]
        note = (
            Content.styled(f"not measured: {', '.join(missing)} (see 'not measured' below)", "$text-muted")
            if missing
            else Content("")
        )
        return Content("\n").join([bar, Content.assemble(*legend), note])
