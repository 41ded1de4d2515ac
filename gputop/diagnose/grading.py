"""When a figure counts as evidence, how it grades into a severity, and a finding's doc link."""

from __future__ import annotations

from gputop.diagnose.findings import Cause, Severity
from gputop.diagnose.thresholds import MIN_STEPS
from gputop.model.figures import RankFigures, RunFigures

DOC_PATH = "docs/diagnosis.md"


def doc_anchor(cause: Cause) -> str:
    """The section of docs/diagnosis.md that explains a cause."""
    return f"{DOC_PATH}#{cause}"


def is_measured(rank: RankFigures) -> bool:
    """Reporting, with enough steps in the span for shares of step time to mean something."""
    return rank.active and rank.stats.steps >= MIN_STEPS and rank.stats.step_time_mean_s is not None


def measured(run: RunFigures) -> list[RankFigures]:
    """The run's ranks whose shares of step time are evidence."""
    return [r for r in run.ranks if is_measured(r)]


def grade_above(value: float | None, warn: float, critical: float) -> Severity | None:
    """'critical' past the critical line, 'warn' past the warn line, else None (N/A never fires)."""
    if value is None:
        return None
    if value > critical:
        return "critical"
    if value > warn:
        return "warn"
    return None


def grade_below(value: float | None, warn: float, critical: float) -> Severity | None:
    """Like ``grade_above`` for figures where lower is worse (utilization, step time)."""
    if value is None:
        return None
    if value < critical:
        return "critical"
    if value < warn:
        return "warn"
    return None
