"""``gputop report --compare BEFORE AFTER``: did the fix work?  Two recordings, side by side.

Each recording is summarised as ``gputop report`` does (the whole run's
figures, the findings over them); the two are then set against each other:
the step time (and so steps per second) with its noise band, each phase's
share, the model FLOPs utilization, each rank's step, each collective's exposed time a step (where the ranks
timed them one by one), and which findings went away, stayed or appeared.
"steps 1.31x faster (182 -> 139 ms, +-2%); loader wait 37% -> 2%; data_loading
cleared" is the proof a fix worked, or the news that it did not.

The noise band is the 95% interval of the difference, from each run's
window-to-window spread of the mean step (Student's t for few windows, as the
diagnosis's bands): a change inside it is "no change beyond noise", so a
re-run on a busy machine does not read as a win.

Pure: figures and findings in, plain data out; the CLI loads the files.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from gputop.combine import OWN_PHASES
from gputop.diagnose import Finding
from gputop.model.figures import Figures, RankFigures, RunFigures, stat_reader
from gputop.model.statistics import t95

SHOWN = ("warn", "critical")  # the severities a finding counts as "there" at


@dataclass(frozen=True)
class StepTime:
    """A run's mean step over its windows, and the half-width of its 95% interval."""

    mean_s: float
    band_s: float
    windows: int


def step_time(run: RunFigures) -> StepTime | None:
    """The mean wall step over every rank's timed steps, pooled (in synchronous DDP they step alike).

    Each window weighs by its steps, as the report's step time does; the band is
    the weighted mean's 95% interval from the spread of the windows' own means.
    """
    windows = [(w.timed, w.step_time_sum_s / w.timed) for r in run.ranks for w in r.windows if w.timed > 0]
    steps = sum(n for n, _ in windows)
    if not steps:
        return None
    mean = sum(n * m for n, m in windows) / steps
    k = len(windows)
    if k < 2:
        return StepTime(mean, 0.0, k)
    variance = k / (k - 1) * sum((n * (m - mean)) ** 2 for n, m in windows) / steps**2
    return StepTime(mean, t95(k - 1) * math.sqrt(variance), k)


OPTIONAL = {p.name: p.seconds for p in OWN_PHASES if p.optional}

# The phases compared, as the table shows them: a share of the step, or milliseconds a step.
Reader = Callable[[RankFigures], float | None]


PHASES: tuple[tuple[str, str, Reader], ...] = (
    ("loader wait", "%", lambda r: r.stats.phases.loader_wait_frac),
    *((p.name, "ms", stat_reader(p.seconds)) for p in OWN_PHASES if p.name != "loader"),  # gputop.combine's phases
    ("exposed comm", "%", lambda r: r.stats.phases.exposed_comm_frac),
    ("outside the phases", "ms", lambda r: r.stats.phases.other_s),
    ("cpu wait", "%", lambda r: r.stats.cpu.starved_frac),
    ("MFU", "%", lambda r: r.mfu),  # the work a step does, over the device's peak (docs/mfu.md)
)


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _shown(value: float | None, unit: str) -> float | None:
    if value is None:
        return None
    return round(value * (100 if unit == "%" else 1000), 1)


def _causes(findings: Sequence[Finding], run_id: str) -> dict[str, Finding]:
    """The run's warn/critical findings by cause (the first, worst, of each)."""
    out: dict[str, Finding] = {}
    for f in findings:
        if f.run_id in (run_id, None) and f.severity in SHOWN:
            out.setdefault(f.cause, f)
    return out


class _Speed(TypedDict):
    before_ms: float | None
    after_ms: float | None
    speedup_x: float | None
    band_pct: float | None


class Speed(_Speed, total=False):
    """A run's step time before and after (``step`` in the JSON); None: a side timed no step."""

    beyond_noise: bool  # only where both sides were timed


def compare_runs(
    before: RunFigures, after: RunFigures, before_findings: Sequence[Finding], after_findings: Sequence[Finding]
) -> dict[str, Any]:
    """One run before and after, as plain data (what ``--format json`` prints)."""
    old, new = step_time(before), step_time(after)
    speed: Speed = {"before_ms": None, "after_ms": None, "speedup_x": None, "band_pct": None}
    if old is not None and new is not None and new.mean_s > 0:
        ratio = old.mean_s / new.mean_s
        relative = math.hypot(old.band_s / old.mean_s, new.band_s / new.mean_s) if old.mean_s else 0.0
        speed = {
            "before_ms": round(old.mean_s * 1e3, 2),
            "after_ms": round(new.mean_s * 1e3, 2),
            "speedup_x": round(ratio, 3),
            "band_pct": round(100 * relative, 1),
            "beyond_noise": abs(ratio - 1.0) > relative,
        }
    phases = compare_phases(before, after)
    after_by_rank = {r.rank: r for r in after.ranks}
    ranks = [
        {
            "rank": r.rank,
            "before_ms": _shown(r.stats.step.mean_s, "ms"),
            "after_ms": _shown(after_by_rank[r.rank].stats.step.mean_s, "ms") if r.rank in after_by_rank else None,
        }
        for r in before.ranks
    ]
    was, now = _causes(before_findings, before.run_id), _causes(after_findings, after.run_id)
    return {
        "collectives": compare_collectives(before, after),
        "before_run": before.run_id,
        "after_run": after.run_id,
        "step": speed,
        "phases": phases,
        "ranks": ranks,
        "findings": {
            "cleared": [{"cause": c, "title": f.title} for c, f in was.items() if c not in now],
            "stayed": [{"cause": c, "before": was[c].title, "after": f.title} for c, f in now.items() if c in was],
            "appeared": [{"cause": c, "title": f.title} for c, f in now.items() if c not in was],
        },
        "headline": headline(speed, phases, was, now),
    }


def compare_phases(before: RunFigures, after: RunFigures) -> list[dict[str, Any]]:
    """Each phase's mean over the ranks, before and after, in its unit (a share of the step, or ms a step)."""
    # A phase one recording times and the other does not (the optimizer's, from an older reporter) would
    # seem to leave "outside the phases" in the one that times it: both read it inside the rest instead.
    folded = [
        seconds
        for name, seconds in OPTIONAL.items()
        if any(getattr(r.stats.phases, seconds) is None for r in (*before.ranks, *after.ranks))
    ]

    def outside(rank: RankFigures) -> float | None:
        other = rank.stats.phases.other_s
        return None if other is None else other + sum(getattr(rank.stats.phases, s) or 0.0 for s in folded)

    compared = [
        (name, unit, outside if name == "outside the phases" else read)
        for name, unit, read in PHASES
        if OPTIONAL.get(name) not in folded
    ]
    return [
        {
            "phase": name,
            "unit": unit,
            "before": _shown(_mean([read(r) for r in before.ranks]), unit),
            "after": _shown(_mean([read(r) for r in after.ranks]), unit),
        }
        for name, unit, read in compared
    ]


def _exposed_ms(run: RunFigures) -> dict[str, float]:
    """Each collective's exposed time a step (``all_gather on dp``), the mean over the ranks that timed it."""
    seen: dict[str, list[float]] = {}
    for rank in run.ranks:
        for c in rank.stats.collectives:
            if c.exposed_s is not None:
                seen.setdefault(c.name, []).append(c.exposed_s * 1e3)
    return {name: sum(values) / len(values) for name, values in seen.items()}


def compare_collectives(before: RunFigures, after: RunFigures) -> list[dict[str, Any]]:
    """Each collective either run timed, its exposed ms a step before and after (None: not in that run)."""
    old, new = _exposed_ms(before), _exposed_ms(after)
    names = sorted(old.keys() | new.keys(), key=lambda name: -max(old.get(name, 0.0), new.get(name, 0.0)))
    return [
        {"collective": name, "before_exposed_ms": _round2(old.get(name)), "after_exposed_ms": _round2(new.get(name))}
        for name in names
    ]


def _round2(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def headline(speed: Speed, phases: list[dict[str, Any]], was: dict[str, Finding], now: dict[str, Finding]) -> str:
    """ "steps 1.31x faster (182 -> 139 ms, +-2%); loader wait 37% -> 2%; data_loading cleared"."""
    parts = []
    if speed["speedup_x"] is not None:
        ratio, band = speed["speedup_x"], speed["band_pct"]
        span = f"({speed['before_ms']:.0f} → {speed['after_ms']:.0f} ms, ±{band:.0f}%)"
        if not speed["beyond_noise"]:
            parts.append(f"step time unchanged within noise {span}")
        elif ratio > 1:
            parts.append(f"steps {ratio:.2f}x faster {span}")
        else:
            parts.append(f"steps {1 / ratio:.2f}x slower {span}")
    for phase in phases:  # the shares that moved by at least 5 points: what the fix changed
        before, after = phase["before"], phase["after"]
        if phase["unit"] == "%" and before is not None and after is not None and abs(before - after) >= 5:
            parts.append(f"{phase['phase']} {before:.0f}% → {after:.0f}%")
    parts += [f"{cause} cleared" for cause in was if cause not in now]
    parts += [f"{cause} appeared" for cause in now if cause not in was]
    return "; ".join(parts) if parts else "no figure to compare"


def compare(
    before: Figures, after: Figures, before_findings: Sequence[Finding], after_findings: Sequence[Finding]
) -> dict[str, Any]:
    """Both recordings' runs paired: by name where both have it, else in order."""
    pairs: list[tuple[RunFigures, RunFigures]] = []
    unmatched = list(after.runs)
    for run in before.runs:
        match = next((r for r in unmatched if r.snapshot.name and r.snapshot.name == run.snapshot.name), None)
        if match is None and unmatched:
            match = unmatched[0]
        if match is not None:
            unmatched.remove(match)
            pairs.append((run, match))
    return {"runs": [compare_runs(b, a, before_findings, after_findings) for b, a in pairs]}


def _num(value: float | None, unit: str) -> str:
    if value is None:
        return "N/A"
    return f"{value:.1f}%" if unit == "%" else f"{value:.1f} ms"


def to_text(report: dict[str, Any], before_name: str, after_name: str) -> str:
    if not report["runs"]:
        return f"No run in both recordings to compare ({before_name}, {after_name}).\n"
    lines = []
    for run in report["runs"]:
        lines.append(f"{before_name} → {after_name}: {run['headline']}")
        lines.append(f"  {'phase':<20} {'before':>10} {'after':>10}")
        step = run["step"]
        if step["before_ms"] is not None:
            lines.append(f"  {'step':<20} {step['before_ms']:>7.1f} ms {step['after_ms']:>7.1f} ms")
        for phase in run["phases"]:
            if phase["before"] is None and phase["after"] is None:
                continue
            old, new = _num(phase["before"], phase["unit"]), _num(phase["after"], phase["unit"])
            lines.append(f"  {phase['phase']:<20} {old:>10} {new:>10}")
        for rank in run["ranks"]:
            lines.append(
                f"  rank {rank['rank']:<15} {_num(rank['before_ms'], 'ms'):>10} {_num(rank['after_ms'], 'ms'):>10}"
            )
        for c in run.get("collectives", ()):
            old, new = _num(c["before_exposed_ms"], "ms"), _num(c["after_exposed_ms"], "ms")
            lines.append(f"  {c['collective'] + ' exposed':<20} {old:>10} {new:>10}")
        findings = run["findings"]
        for kind in ("cleared", "stayed", "appeared"):
            for f in findings[kind]:
                title = f.get("title") or f.get("after")
                lines.append(f"  {kind}: {f['cause']}: {title}")
    return "\n".join(lines) + "\n"


def to_markdown(report: dict[str, Any], before_name: str, after_name: str) -> str:
    if not report["runs"]:
        return f"No run in both recordings to compare (`{before_name}`, `{after_name}`).\n"
    out = []
    for run in report["runs"]:
        out += [f"**`{before_name}` → `{after_name}`**: {run['headline']}", "", "| | before | after |", "|---|---|---|"]
        step = run["step"]
        if step["before_ms"] is not None:
            out.append(f"| step | {step['before_ms']:.1f} ms | {step['after_ms']:.1f} ms |")
        out += [
            f"| {p['phase']} | {_num(p['before'], p['unit'])} | {_num(p['after'], p['unit'])} |"
            for p in run["phases"]
            if p["before"] is not None or p["after"] is not None
        ]
        out += [
            f"| rank {r['rank']} | {_num(r['before_ms'], 'ms')} | {_num(r['after_ms'], 'ms')} |" for r in run["ranks"]
        ]
        for c in run.get("collectives", ()):
            old, new = _num(c["before_exposed_ms"], "ms"), _num(c["after_exposed_ms"], "ms")
            out.append(f"| {c['collective']} exposed | {old} | {new} |")
        out.append("")
        for kind in ("cleared", "stayed", "appeared"):
            out += [f"- {kind}: {f['cause']}: {f.get('title') or f.get('after')}" for f in run["findings"][kind]]
        out.append("")
    return "\n".join(out)
