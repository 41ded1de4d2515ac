"""The diagnosis, worst first; or a truthful line saying why there is nothing to show."""

from __future__ import annotations

import textwrap

from textual.app import RenderResult
from textual.content import Content
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


class FindingsPanel(Widget):
    """Findings with their suggestion; one line each when ``brief``."""

    DEFAULT_CSS = """
    FindingsPanel {
        height: auto;
    }
    """

    findings: reactive[tuple[Finding, ...]] = reactive((), layout=True)
    """What the diagnosis found, worst first."""
    diagnosis: reactive[str] = reactive("off", layout=True)
    """"off" (no rules given), "ok", "waiting", or "failed: <reason>"."""
    brief: reactive[bool] = reactive(False, layout=True)
    """Titles only, no suggestions (small terminals)."""
    cpu_sharing: reactive[str | None] = reactive(None, layout=True)
    """Who else uses the host's CPUs, shown first: it colours every figure below."""

    def render(self) -> RenderResult:
        body = self._render_findings()
        if not self.cpu_sharing:
            return body
        note = self._hanging([("◆ ", "bold $warning"), ("shared CPU ", "$text-muted")], self.cpu_sharing, "", 2)
        return Content("\n").join([note, body])

    def _hanging(self, head: list[tuple[str, str]], text: str, style: str, indent: int) -> Content:
        """``head`` then ``text``, wrapped to the panel's width with later lines indented ``indent`` cells.

        Wrapped here rather than by Textual so the continuation lines hang under the text,
        not under the severity mark.
        """
        width = max(self.size.width, 20)
        first = width - sum(len(part) for part, _ in head)
        lines = textwrap.wrap(text, width=max(first, 10)) or [""]
        rest = textwrap.wrap(" ".join(lines[1:]), width=max(width - indent, 10)) if len(lines) > 1 else []
        parts: list[tuple[str, str] | str] = [*head, (lines[0], style)]
        for line in rest:
            parts += ["\n", " " * indent, (line, style)]
        return Content.assemble(*parts)

    def _render_findings(self) -> Content:
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
            lines.append(self._hanging(head, f.title, "", 2))
            if not self.brief and f.suggestion:
                lines.append(self._hanging([("  → ", "")], f.suggestion, "$text-muted", 4))
        return Content("\n").join(lines)
