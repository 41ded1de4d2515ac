"""The diagnosis, worst first; or a truthful line saying why there is nothing to show."""

from __future__ import annotations

import textwrap
from typing import Any

from textual.app import RenderResult
from textual.content import Content
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from gputop.diagnose.findings import Finding

SEVERITY_STYLE = {"critical": "bold $error", "warn": "bold $warning", "info": "bold $accent"}
SEVERITY_MARK = {"critical": "✖", "warn": "▲", "info": "●"}


def _where(finding: Finding) -> str:
    if finding.ranks:
        shown = ",".join(str(r) for r in finding.ranks[:4])
        more = f"+{len(finding.ranks) - 4}" if len(finding.ranks) > 4 else ""
        return f"[rank {shown}{more}] "
    if finding.gpus:
        return f"[GPU {','.join(str(g) for g in finding.gpus)}] "
    return ""


class FindingsResized(Message):
    """The findings were laid out at a new size: the lines they need, and so the middle's height, may change."""


class FindingsPanel(Widget):
    """Findings with their suggestion; one line each when ``brief``."""

    DEFAULT_CSS = """
    FindingsPanel {
        height: auto;
    }
    """

    # A change repaints the panel; only a change in its number of lines lays the screen out again
    # (findings' figures move on every refresh of a live run, their line count seldom does).
    findings: reactive[tuple[Finding, ...]] = reactive(())
    """What the diagnosis found, worst first."""
    diagnosis: reactive[str] = reactive("off")
    """"off" (no rules given), "ok", "waiting", or "failed: <reason>"."""
    brief: reactive[bool] = reactive(False)
    """Titles only, no suggestions (small terminals)."""
    cpu_sharing: reactive[str | None] = reactive(None)
    """Who else uses the host's CPUs, shown first: it colours every figure below."""

    _lines: int | None = None  # the height last laid out for

    def __init__(self, *args: Any, price_per_hour: float | None = None, **kwargs: Any) -> None:
        """``price_per_hour``: a GPU-hour's price (``--gpu-hour-price``), to show the waste in money."""
        super().__init__(*args, **kwargs)
        self.price_per_hour = price_per_hour
        # Lines by width for the content now: the layout and the app's fitting of the middle both ask each refresh.
        self._heights: dict[int, int] = {}

    def watch_findings(self) -> None:
        self._relayout_if_resized()

    def watch_diagnosis(self) -> None:
        self._relayout_if_resized()

    def watch_brief(self) -> None:
        self._relayout_if_resized()

    def watch_cpu_sharing(self) -> None:
        self._relayout_if_resized()

    def on_resize(self) -> None:
        self._lines = None  # the layout just happened at the new width
        # The first layout can come after the app fitted the middle to a panel of no width yet.
        self.post_message(FindingsResized())

    def _relayout_if_resized(self) -> None:
        self._heights.clear()  # the content changed
        width = self.size.width
        lines = self.get_content_height(self.size, self.size, width) if width else None
        if lines != self._lines or lines is None:
            self._lines = lines
            self.refresh(layout=True)

    def render(self) -> RenderResult:
        return self._content(self.size.width)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """The lines the findings take at ``width`` (the layout asks before the panel has that width)."""
        if not width:
            return 0
        if width not in self._heights:
            self._heights[width] = self._content(width).get_height(self.styles, width)  # type: ignore[arg-type]  # as Textual passes it
        return self._heights[width]

    def _content(self, width: int) -> Content:
        body = self._render_findings(width)
        if not self.cpu_sharing:
            return body
        head = [("◆ ", "bold $warning"), ("shared CPU ", "$text-muted")]
        return Content("\n").join([self._hanging(head, self.cpu_sharing, "", 2, width), body])

    @staticmethod
    def _hanging(head: list[tuple[str, str]], text: str, style: str, indent: int, width: int) -> Content:
        """``head`` then ``text``, wrapped to ``width`` with later lines indented ``indent`` cells.

        Wrapped here rather than by Textual so the continuation lines hang under the text,
        not under the severity mark.
        """
        width = max(width, 20)
        first = width - sum(len(part) for part, _ in head)
        lines = textwrap.wrap(text, width=max(first, 10)) or [""]
        rest = textwrap.wrap(" ".join(lines[1:]), width=max(width - indent, 10)) if len(lines) > 1 else []
        parts: list[tuple[str, str] | str] = [*head, (lines[0], style)]
        for line in rest:
            parts += ["\n", " " * indent, (line, style)]
        return Content.assemble(*parts)

    def _render_findings(self, width: int) -> Content:
        if self.diagnosis == "off":
            return Content.styled("no rules active (this dashboard was started without a diagnoser)", "$text-muted")
        if self.diagnosis.startswith("failed"):
            return Content.assemble(("diagnosis ", "bold $error"), self.diagnosis)
        if self.diagnosis == "waiting":
            return Content.styled("waiting for data to diagnose…", "$text-muted")
        if not self.findings:
            return Content.assemble(("✔ ", "$success"), ("no issues found", "$text-muted"))
        lines = []
        for f in self.findings:
            head = [
                (f"{SEVERITY_MARK.get(f.severity, '●')} ", SEVERITY_STYLE.get(f.severity, "bold")),
                (f"{f.cause:<13} ", "$text-muted"),
                (_where(f), "bold"),
            ]
            lines.append(self._hanging(head, f.title, "", 2, width))
            if not self.brief and f.suggestion:
                lines.append(self._hanging([("  → ", "")], f.suggestion, "$text-muted", 4, width))
            if not self.brief and (worth := f.worth(self.price_per_hour)):
                lines.append(self._hanging([("  ≈ ", "")], worth, "$success", 4, width))
            if not self.brief and f.capture is not None:  # the culprit rank's profile, taken when it held
                style = "$text-muted" if f.capture.ok else "$error"
                lines.append(self._hanging([("  ⊙ ", "")], f.capture.text(), style, 4, width))
        return Content("\n").join(lines)
