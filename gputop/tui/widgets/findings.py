"""The diagnosis, worst first; or a truthful line saying why there is nothing to show."""

from __future__ import annotations

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

    def render(self) -> RenderResult:
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
            lines.append(
                Content.assemble(
                    (f"{SEVERITY_MARK.get(f.severity, '●')} ", SEVERITY_STYLE.get(f.severity, "bold")),
                    (f"{f.cause:<13} ", "$text-muted"),
                    (_where(f), "bold"),
                    f.title,
                )
            )
            if not self.brief and f.suggestion:
                lines.append(Content.assemble("  → ", (f.suggestion, "$text-muted")))
        return Content("\n").join(lines)
