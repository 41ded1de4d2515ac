"""What the dashboard shows before any rank reports: where it listens, and how to connect."""

from __future__ import annotations

from textual.app import RenderResult
from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget


class EmptyState(Widget):
    """Where the collector listens and the two lines to add to a training script."""

    DEFAULT_CSS = """
    EmptyState {
        height: auto;
    }
    """

    listen: reactive[str] = reactive("", layout=True)
    """Where the collector listens ("" for a replay)."""
    source_text: reactive[str] = reactive("", layout=True)
    """The source's own description, shown when there is no listen address."""
    rejected: reactive[tuple[str, ...]] = reactive((), layout=True)
    """Recent connections closed for bad frames."""

    def render(self) -> RenderResult:
        lines: list[Content] = [Content.styled("No training run is reporting yet.", "bold")]
        if self.listen:
            lines.append(Content.assemble(("Listening on ", "$text-muted"), (self.listen, "bold $accent")))
        elif self.source_text:
            lines.append(Content.styled(self.source_text, "$text-muted"))
        lines += [
            Content(""),
            Content.styled("Add two lines to the training script:", "$text-muted"),
            Content.assemble(
                "    ", ("gputop.watch(model)", "bold $success"), ("          # after DDP(...)", "$text-muted")
            ),
            Content.assemble("    ", ("for batch in gputop.track(loader):", "bold $success")),
            Content(""),
            Content.styled("Every rank started that way (torchrun, mp.spawn, python) appears here.", "$text-muted"),
        ]
        for reason in self.rejected[-3:]:
            lines.append(Content.assemble(("rejected a connection: ", "$warning"), reason))
        return Content("\n").join(lines)
