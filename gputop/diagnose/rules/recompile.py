"""recompile: torch.compile compiles the model again and again, and the device idles while it does.

Read from dynamo's own record, which the reporter forwards (``RankStats``
``compiles``, ``recompiles``, ``recompile_frac``): a guard of a compiled graph
failed (a new sequence length under ``dynamic=False``, a new dtype, a Python
value that changes) and the function was traced and compiled anew, a step that
takes seconds.  Recompiling's share of the run is that time over the wall time;
the first compile of each function is the price of compiling at all, not a
fault (``gputop.model.sums`` counts a window's compile time in the proportion
of its recompiles to its compiles).  The function and dynamo's reason come from
the rank's ``recompile`` events ("recompiled 'forward' (train.py:31): tensor 'x'
size mismatch at index 1. expected 16, actual 24").

A compile is also a long step, which the stall rule would count: it counts only
what compiling leaves (``stall_beyond_compiles``).
"""

from __future__ import annotations

from gputop.diagnose.details import RecompileDetails
from gputop.diagnose.findings import Evidence, Finding
from gputop.diagnose.grading import grade_above, measured
from gputop.diagnose.thresholds import RECOMPILE_CRITICAL_FRAC, RECOMPILE_MIN_COUNT, RECOMPILE_WARN_FRAC
from gputop.diagnose.wording import pct, ranks_text
from gputop.model.figures import RankFigures, RunFigures
from gputop.model.rank_stats import RankStats

RECOMPILE_EVENT = "recompile"  # the reporter's event for each of the first few recompiles: function and reason


def recompile_frac(stats: RankStats) -> float:
    """The share of the run's time spent recompiling (``RankStats.recompile_frac``), 0 where nothing recompiled."""
    return stats.compile.recompile_frac or 0.0 if stats.compile.recompiles else 0.0


def stall_beyond_compiles(stats: RankStats) -> tuple[int, float]:
    """The stall steps and their share of step time that compiling (a first compile or a recompile) leaves."""
    steps = max((stats.stalls.steps or 0) - (stats.compile.compiles or 0), 0)
    return steps, max((stats.stalls.frac or 0.0) - (stats.compile.frac or 0.0), 0.0)


def recompile_findings(run: RunFigures) -> list[Finding]:
    """One finding per run whose ranks recompile at least twice and lose a share of their time to it."""
    ranks = [r for r in measured(run) if (r.stats.compile.recompiles or 0) >= RECOMPILE_MIN_COUNT]
    if not ranks:
        return []
    main = max(ranks, key=lambda r: recompile_frac(r.stats))
    stats = main.stats
    frac = recompile_frac(stats)
    severity = grade_above(frac, RECOMPILE_WARN_FRAC, RECOMPILE_CRITICAL_FRAC)
    if severity is None:
        return []
    named = [r for r in ranks if grade_above(recompile_frac(r.stats), RECOMPILE_WARN_FRAC, RECOMPILE_CRITICAL_FRAC)]
    count = stats.compile.recompiles or 0
    each_s = (stats.compile.recompile_s or 0.0) / count
    function, reason = last_recompile(main)
    title = (
        f"{ranks_text([r.rank for r in named])} recompiled {function or 'a compiled function'} {count} times, "
        f"{each_s:.1f} s each: {pct(frac):.0f}% of the run"
    )
    if reason:
        title += f" ({reason})"
    threshold = RECOMPILE_CRITICAL_FRAC if severity == "critical" else RECOMPILE_WARN_FRAC
    evidence = [
        Evidence("recompile_pct", pct(frac), pct(threshold), "%", rank=main.rank),
        Evidence("recompiles", count, RECOMPILE_MIN_COUNT, op=">=", rank=main.rank),
        Evidence("recompile_s_each", each_s, 0.0, "s", op="vs", rank=main.rank),
        Evidence("compile_s", stats.compile.seconds or 0.0, 0.0, "s", op="vs", rank=main.rank),
    ]
    if stats.compile.graph_breaks:
        evidence.append(Evidence("graph_breaks", stats.compile.graph_breaks, 0, op="vs", rank=main.rank))
    return [
        Finding(
            cause="recompile",
            severity=severity,
            title=title,
            suggestion=recompile_suggestion(function, reason),
            evidence=tuple(evidence),
            ranks=tuple(sorted(r.rank for r in named)),
            run_id=run.run_id,
            magnitude=frac,
            cost_s=frac * (stats.step.mean_s or 0.0),  # each recompile's time, spread over the steps
            step_s=stats.step.mean_s,
            details=RecompileDetails(function=function, reason=reason, recompiles=count, recompile_s_each=each_s),
        )
    ]


def last_recompile(rank: RankFigures) -> tuple[str | None, str | None]:
    """The function and dynamo's reason from the rank's newest ``recompile`` event; (None, None) without one."""
    for event in reversed(rank.snapshot.events):
        if event.kind == RECOMPILE_EVENT and event.message.startswith("recompiled "):
            function, _, reason = event.message.removeprefix("recompiled ").partition(": ")
            # Dynamo names the compile it was checked against first ("0/1: tensor 'x' ..."): not the user's.
            head, _, rest = reason.partition(": ")
            if rest and "/" in head and " " not in head:
                reason = rest
            return function or None, reason or None
    return None, None


def recompile_suggestion(function: str | None, reason: str | None) -> str:
    where = function or "the compiled function"
    if reason is None or "size mismatch" in reason or "size" in reason:
        return (
            f"{where} gets inputs of new shapes under torch.compile(..., dynamic=False): compile it with "
            "dynamic=True (or leave dynamic unset, so dynamo makes a dimension dynamic after it first changes), "
            "mark the changing dimension with torch._dynamo.mark_dynamic(x, dim) before the call, or pad the "
            "batches to a few bucketed lengths (multiples of 64) so a handful of graphs serve every batch."
        )
    return (
        f"{where} is compiled anew whenever a guard fails ({reason}): keep that value fixed between calls, pass "
        'it as a tensor rather than a Python number, or run with TORCH_LOGS="recompiles" once to see every reason.'
    )
