"""memory: GPU memory managed badly, or left unused.

From each CUDA rank's ``torch.cuda.memory_stats()`` figures: the peak against
the device's capacity, allocator retries and OOMs counted during the span,
reserved against allocated.  CPU runs have none of these figures and get no
finding; a figure that is None is never read as zero.
"""

from __future__ import annotations

from collections.abc import Sequence

from gputop.diagnose.findings import SEVERITIES, Evidence, Finding, Severity
from gputop.diagnose.grading import grade_above, is_measured
from gputop.diagnose.thresholds import (
    ALLOC_RETRIES_CRITICAL_PER_STEP,
    ALLOC_RETRIES_WARN,
    MEM_PEAK_CRITICAL_FRAC,
    MEM_PEAK_UNUSED_FRAC,
    MEM_PEAK_WARN_FRAC,
    RESERVED_MINUS_ALLOCATED_MIN_BYTES,
    RESERVED_OVER_ALLOCATED_RATIO,
)
from gputop.diagnose.wording import pct, ranks_text
from gputop.model.figures import RankFigures, RunFigures
from gputop.protocol import Window

GIB = float(1 << 30)


def rise(windows: Sequence[Window], field: str) -> int | None:
    """How much a cumulative counter grew over the windows (None if never reported)."""
    values = [v for v in (getattr(w, field) for w in windows) if v is not None]
    if not values:
        return None
    return max(values[-1] - values[0], 0) if len(values) > 1 else 0


def capacity_bytes(rank: RankFigures) -> int | None:
    measured = rank.stats.memory.total_bytes
    return measured or rank.hello.device_total_bytes or (rank.gpu.mem_total_bytes if rank.gpu else None)


def rank_memory(rank: RankFigures) -> tuple[Severity, list[Evidence], float] | None:
    """This rank's memory trouble: severity, evidence and the peak's share of capacity."""
    evidence: list[Evidence] = []
    severities: list[Severity] = []
    total = capacity_bytes(rank)
    peak = rank.stats.memory.peak_bytes
    peak_frac = peak / total if (peak is not None and total) else None

    severity = grade_above(peak_frac, MEM_PEAK_WARN_FRAC, MEM_PEAK_CRITICAL_FRAC)
    if severity is not None and peak_frac is not None:
        line = MEM_PEAK_CRITICAL_FRAC if severity == "critical" else MEM_PEAK_WARN_FRAC
        evidence.append(Evidence("mem_peak_pct", pct(peak_frac), pct(line), "%", rank=rank.rank))
        severities.append(severity)

    ooms = rise(rank.windows, "ooms")
    if ooms:
        evidence.append(Evidence("ooms", ooms, 0, rank=rank.rank))
        severities.append("critical")

    retries = rise(rank.windows, "alloc_retries")
    if retries is not None and retries >= ALLOC_RETRIES_WARN:
        per_step = retries / max(rank.stats.steps, 1)
        thrashing = per_step > ALLOC_RETRIES_CRITICAL_PER_STEP
        if thrashing:
            evidence.append(
                Evidence("alloc_retries_per_step", per_step, ALLOC_RETRIES_CRITICAL_PER_STEP, rank=rank.rank)
            )
        else:
            evidence.append(Evidence("alloc_retries", retries, ALLOC_RETRIES_WARN, op=">=", rank=rank.rank))
        severities.append("critical" if thrashing else "warn")

    reserved, allocated = rank.stats.memory.reserved_bytes, rank.stats.memory.allocated_bytes
    if reserved is not None and allocated:
        ratio = reserved / allocated
        if ratio > RESERVED_OVER_ALLOCATED_RATIO and reserved - allocated >= RESERVED_MINUS_ALLOCATED_MIN_BYTES:
            evidence.append(
                Evidence("reserved_over_allocated", ratio, RESERVED_OVER_ALLOCATED_RATIO, "x", rank=rank.rank)
            )
            severities.append("info")

    if not severities:
        return None
    return max(severities, key=SEVERITIES.index), evidence, peak_frac or 0.0


def memory_findings(run: RunFigures) -> list[Finding]:
    """One finding per run for memory pressure, or one info finding for memory left unused."""
    cuda = [r for r in run.active if r.on_cuda]
    troubled = [(r, *found) for r in cuda if (found := rank_memory(r)) is not None]
    if troubled:
        severity = max((t[1] for t in troubled), key=SEVERITIES.index)
        worst = max(troubled, key=lambda t: (SEVERITIES.index(t[1]), t[3]))
        rank, _, evidence, peak_frac = worst
        ranks = sorted(t[0].rank for t in troubled)
        total = capacity_bytes(rank)
        title = f"{ranks_text(ranks)}: GPU memory under pressure"
        if peak_frac and total:
            title += f" (rank {rank.rank} peaks at {pct(peak_frac):.0f}% of {total / GIB:.0f} GiB)"
        return [
            Finding(
                cause="memory",
                severity=severity,
                title=title,
                suggestion=pressure_suggestion(evidence),
                evidence=tuple(evidence),
                ranks=tuple(ranks),
                run_id=run.run_id,
                magnitude=peak_frac,
            )
        ]
    return unused_memory_findings(run, cuda)


def pressure_suggestion(evidence: Sequence[Evidence]) -> str:
    metrics = {e.metric for e in evidence}
    if metrics == {"reserved_over_allocated"}:
        return (
            "The caching allocator holds much more than is in use (fragmentation): set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
        )
    return (
        "Lower peak memory: a smaller per-rank batch with gradient accumulation, activation checkpointing "
        "(torch.utils.checkpoint), bf16 autocast; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True cuts "
        "fragmentation-driven retries."
    )


def unused_memory_findings(run: RunFigures, cuda: list[RankFigures]) -> list[Finding]:
    """Info: every measured CUDA rank peaks far below capacity, so the batch could grow."""
    fracs = []
    for rank in cuda:
        total, peak = capacity_bytes(rank), rank.stats.memory.peak_bytes
        if not is_measured(rank) or peak is None or not total:
            return []
        fracs.append(peak / total)
    if not fracs or max(fracs) >= MEM_PEAK_UNUSED_FRAC:
        return []
    top = max(fracs)
    batch = cuda[0].hello.loader_batch_size
    return [
        Finding(
            cause="memory",
            severity="info",
            title=f"{ranks_text([r.rank for r in cuda])} peak at {pct(top):.0f}% of GPU memory: the batch could grow",
            suggestion=(f"Try DataLoader(batch_size={batch * 2})" if batch else "Try a larger batch_size")
            + " and scale the learning rate with it; watch this panel for the peak.",
            evidence=(Evidence("mem_peak_pct", pct(top), pct(MEM_PEAK_UNUSED_FRAC), "%", op="<"),),
            ranks=tuple(r.rank for r in cuda),
            run_id=run.run_id,
        )
    ]
