"""When a figure counts as evidence, and how it grades into a severity."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gputop.diagnose.findings import SEVERITIES, Finding, Severity
from gputop.diagnose.thresholds import MIN_STEPS
from gputop.model.figures import RankFigures, RunFigures


def is_measured(rank: RankFigures) -> bool:
    """Reporting, with enough steps in the span for shares of step time to mean something."""
    return rank.active and rank.stats.steps >= MIN_STEPS and rank.stats.step.mean_s is not None


def measured(run: RunFigures) -> list[RankFigures]:
    """The run's ranks whose shares of step time are evidence."""
    return [r for r in run.ranks if is_measured(r)]


def mean_step_s(ranks: Sequence[RankFigures]) -> float | None:
    """The ranks' mean wall step time: what a finding's cost is a part of."""
    steps = [r.stats.step.mean_s for r in ranks if r.stats.step.mean_s]
    return sum(steps) / len(steps) if steps else None


def largest_cost(findings: Sequence[Finding]) -> float | None:
    """A merged finding is worth what the costliest of its parts is (they overlap; they do not add)."""
    costs = [f.cost_s for f in findings if f.cost_s is not None]
    return max(costs) if costs else None


def fold_symptoms(
    findings: Sequence[Finding], index: int, symptoms: Sequence[Finding], note: str, *, name_them: bool = True
) -> list[Finding]:
    """The findings with ``findings[index]`` (a cause) taking its ``symptoms`` in: a measured cause outranks them.

    The cause gets their worst severity, their first evidence and the largest cost
    estimate; with ``name_them`` its title says how they showed ("it shows as
    communication 23%") and its magnitude is the largest.  The symptoms stay listed,
    as info, with ``note`` ("a symptom of CPU contention, see allocation"), so
    nothing is hidden.
    """
    cause = findings[index]
    folded = replace(
        cause,
        severity=max([cause.severity, *(f.severity for f in symptoms)], key=SEVERITIES.index),
        evidence=cause.evidence + tuple(e for f in symptoms for e in f.evidence[:1]),
        cost_s=largest_cost([cause, *symptoms]),
        step_s=cause.step_s or next((f.step_s for f in symptoms if f.step_s), None),
    )
    if name_them:
        shown = ", ".join(f"{f.cause} {100 * f.magnitude:.0f}%" for f in symptoms)
        folded = replace(
            folded,
            title=cause.title + f"; it shows as {shown}",
            magnitude=max([cause.magnitude, *(f.magnitude for f in symptoms)]),
        )
    out = [replace(f, severity="info", title=f"{f.title} ({note})") if f in symptoms else f for f in findings]
    out[index] = folded
    return out


def grade_above(value: float | None, warn: float, critical: float) -> Severity | None:
    """'critical' past the critical line, 'warn' past the warn line, else None (N/A never fires)."""
    if value is None:
        return None
    if value > critical:
        return "critical"
    if value > warn:
        return "warn"
    return None


# A share is decided by its band, share +- BAND_ERRORS standard errors: past a
# line only when the whole band is (about 95% confidence for a mean of windows).
BAND_ERRORS = 2.0


def grade_band(value: float | None, se: float | None, warn: float, critical: float) -> tuple[Severity | None, bool]:
    """Grade the low end of the value's band; also say whether the point is past ``warn`` but the band is not.

    The second item, "too close to call", lets a rule report as info a share
    whose identical runs would fall on both sides of the line, instead of a
    warning that flips between them.  Without an error (fewer than 3 windows:
    a run's first second, a recording of one) nothing is decided either: a
    share past the line is too close to call until there are windows to tell
    a level from a blip.
    """
    if value is None:
        return None, False
    if se is None:
        return None, value > warn
    severity = grade_above(value - BAND_ERRORS * se, warn, critical)
    return severity, severity is None and value > warn


def grade_below(value: float | None, warn: float, critical: float) -> Severity | None:
    """Like ``grade_above`` for figures where lower is worse (utilization, step time)."""
    if value is None:
        return None
    if value < critical:
        return "critical"
    if value < warn:
        return "warn"
    return None
