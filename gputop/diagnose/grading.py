"""Turning a measured value and two thresholds into a severity, and a Finding's doc link."""

from __future__ import annotations

DOC_PATH = "docs/diagnosis.md"


def doc_anchor(cause: str) -> str:
    """The section of docs/diagnosis.md that explains a cause."""
    return f"{DOC_PATH}#{cause}"


def grade_above(value: float | None, warn: float, critical: float) -> str | None:
    """'critical' past the critical line, 'warn' past the warn line, else None (N/A never fires)."""
    if value is None:
        return None
    if value > critical:
        return "critical"
    if value > warn:
        return "warn"
    return None


def grade_below(value: float | None, warn: float, critical: float) -> str | None:
    """Like ``grade_above`` for figures where lower is worse (utilization, step time)."""
    if value is None:
        return None
    if value < critical:
        return "critical"
    if value < warn:
        return "warn"
    return None
