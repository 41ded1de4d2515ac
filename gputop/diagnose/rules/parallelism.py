"""parallelism: too little work per step for the device to stay busy.

Five signs, each only where its numbers are measured: the GPU is mostly idle
although neither the loader nor the gradient exchange holds it up; the GPU is
busy for a small part of each wall step; steps are so short, at a small batch,
that fixed per-step costs (Python, launches, the all-reduce's latency) are most
of them; at a small batch, the gradient exchange is a large share of the
step only because the step does so little work; or the GPU's kernels run most
of the time and the step's FLOPs reach a small share of its peak (small,
launch-bound kernels).  All five call for more work per step.

The work each step does (its counted FLOPs, issue #46) judges them: a step whose
compute reaches ``WORK_ENOUGH_MFU`` of its device's peak, over the time no other
cause takes, does its device's worth of work and is never called short, however
short it is or however large the exchange's share; one under ``WORK_LITTLE_MFU``
has that MFU in the finding's evidence.  Unmeasured (no count, no peak), the
signs speak alone, as before.

The fourth tells a tiny step's symptom from a real communication problem by
what more work per step would do.  The exchange moves the gradients, whose size
does not depend on the batch, so its exposed time stays; forward and backward
grow with the batch.  At ``BATCH_GROWTH`` times the batch (what the fix
suggests) the step is about ``step + (BATCH_GROWTH - 1) x (forward + backward)``
(an upper bound: at a tiny batch compute grows less than the batch does, which
only lowers the projection's step), and the exchange's share of it is
``exposed / that``.  When that share falls under the communication line, the
exchange is a symptom and the cause is too little work per step; when it stays
over it (50 MB of gradients for a few ms of compute), communication is the cause.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gputop.diagnose.details import ParallelismDetails
from gputop.diagnose.findings import SEVERITIES, Finding
from gputop.diagnose.grading import largest_cost, measured
from gputop.diagnose.rules.parallelism_signs import (
    BATCH_GROWTH,
    compute_mfu,
    exchange_sign,
    gpu_step_sign,
    idle_gpu_sign,
    little_work_evidence,
    little_work_sign,
    small_kernels_sign,
    tiny_step_sign,
)
from gputop.diagnose.thresholds import (
    GPU_UTIL_LOW_WARN_PCT,
    TINY_STEP_WARN_S,
    WORK_ENOUGH_MFU,
    WORK_LITTLE_MFU,
)
from gputop.diagnose.wording import pct, ranks_text
from gputop.model.figures import RankFigures, RunFigures
from gputop.model.statistics import median


def parallelism_findings(run: RunFigures, *, exchange_explained: bool = False) -> list[Finding]:
    """At most one finding per run, carrying the evidence of every sign that fired.

    ``exchange_explained``: a setting explains the exposed exchange (``model_config``'s tiny buckets), so the
    exchange is not read as a sign of too little work per step (sign 4).
    """
    ranks = measured(run)
    if not ranks:
        return []
    work = median([x for r in ranks if (x := compute_mfu(r)) is not None])
    if work is not None and work >= WORK_ENOUGH_MFU:
        return []  # the steps do their device's worth of work: whatever else holds them up, it is not that
    idle, util = idle_gpu_sign(ranks)
    tiny, step = tiny_step_sign(ranks)
    exchange, exchange_at = (None, None) if exchange_explained else exchange_sign(ranks, tiny_steps=tiny is not None)
    kernels = small_kernels_sign(ranks)
    signs = [sign for sign in (idle, gpu_step_sign(ranks), tiny, exchange, kernels) if sign]
    # The work alone names the cause where no sign of time does (sign 6): the step is not short, just empty.
    alone = little_work_sign(ranks) if not signs else None
    signs = signs or ([alone] if alone else [])
    if not signs:
        return []
    fired = sorted(set().union(*(sign.ranks for sign in signs)))
    named = {e.metric for sign in signs for e in sign.evidence}
    little = () if work is None or work >= WORK_LITTLE_MFU or "mfu_pct" in named else (little_work_evidence(ranks),)
    return [
        Finding(
            cause="parallelism",
            severity=max((sign.severity for sign in signs), key=SEVERITIES.index),
            title=parallelism_title(
                fired,
                util,
                step,
                exchange_at,
                little_mfu=work if little or alone else None,
                small_kernels=kernels is not None and len(signs) == 1,
                little_work=None if alone is None else int(alone.evidence[1].value),
            ),
            suggestion=parallelism_suggestion(ranks[0], launch_bound=any(sign.launch_bound for sign in signs)),
            evidence=tuple(e for sign in signs for e in sign.evidence) + little,
            ranks=tuple(fired),
            run_id=run.run_id,
            magnitude=max(sign.magnitude for sign in signs),
            # The exchange's finding is this one's symptom where the steps are tiny (tiny_steps_explain).
            details=ParallelismDetails(
                tiny_steps=tiny is not None or exchange is not None, exchange_symptom=exchange is not None
            ),
        )
    ]


JITTER_TOO = "; the all-reduce and rank jitter add up to a large share"


def has_tiny_steps(parallelism: Finding) -> bool:
    """A parallelism finding whose steps are tiny (or whose exchange more work would hide): it explains fixed costs."""
    return isinstance(parallelism.details, ParallelismDetails) and parallelism.details.tiny_steps


def tiny_steps_explain(parallelism: Finding, finding: Finding) -> bool:
    """A communication or straggler finding of a tiny-step run: a symptom of too little work per step.

    When steps last a few milliseconds at a small batch, the all-reduce's fixed
    latency and a millisecond of scheduling jitter on one rank are large shares
    of the step, and the fix is the same (more work per step), whatever their
    grade.  Steps short in themselves make every rank's jitter a large share too;
    an exchange that is long only next to a short step says nothing of a slow
    rank, whose finding stays its own.
    """
    if not isinstance(parallelism.details, ParallelismDetails) or finding.run_id != parallelism.run_id:
        return False
    causes = ("communication",) if parallelism.details.exchange_symptom else ("communication", "straggler")
    return finding.cause in causes


def fold_fixed_costs(findings: Sequence[Finding], index: int, symptoms: Sequence[Finding], note: str) -> list[Finding]:
    """The findings with the parallelism finding at ``index`` taking in the fixed costs its tiny steps explain.

    Like ``fold_symptoms``, but the evidence its signs already name is not
    repeated, and its title adds that the all-reduce and rank jitter add up,
    unless only the exchange was its symptom.  The symptoms stay listed, as
    info, with ``note``, so nothing is hidden.
    """
    parallelism = findings[index]
    exchange_only = isinstance(parallelism.details, ParallelismDetails) and parallelism.details.exchange_symptom
    named = {e.metric for e in parallelism.evidence}
    merged = replace(
        parallelism,
        severity=max([parallelism.severity, *(f.severity for f in symptoms)], key=SEVERITIES.index),
        evidence=parallelism.evidence + tuple(e for f in symptoms for e in f.evidence[:1] if e.metric not in named),
        magnitude=max([parallelism.magnitude, *(f.magnitude for f in symptoms)]),
        cost_s=largest_cost([parallelism, *symptoms]),
        step_s=parallelism.step_s or next((f.step_s for f in symptoms if f.step_s), None),
        title=parallelism.title + ("" if exchange_only else JITTER_TOO),
    )
    out = [replace(f, severity="info", title=f"{f.title} ({note})") if f in symptoms else f for f in findings]
    out[index] = merged
    return out


def parallelism_title(
    ranks: list[int],
    util_pct: float | None,
    step_s: float | None,
    exchange: tuple[int, float, float] | None = None,
    little_mfu: float | None = None,
    small_kernels: bool = False,
    little_work: int | None = None,
) -> str:
    if small_kernels:
        return f"{ranks_text(ranks)}: the GPU runs kernels most of the time but they do little work: small kernels"
    title = _title(ranks, util_pct, step_s, exchange, little_work)
    if little_mfu is None:
        return title
    share = pct(little_mfu)
    shown = f"{share:.1f}" if share >= 1 else f"{share:.2g}"  # 8.0%, 0.0047%: never a small share as 0.0%
    return f"{title}; its compute reaches {shown}% of the device's peak FLOP/s"


def _title(
    ranks: list[int],
    util_pct: float | None,
    step_s: float | None,
    exchange: tuple[int, float, float] | None,
    little_work: int | None,
) -> str:
    who = ranks_text(ranks)
    if little_work is not None:
        return f"{who}: too little work per step at batch {little_work}"
    if util_pct is not None and util_pct < GPU_UTIL_LOW_WARN_PCT:
        return f"{who}: GPU busy only {util_pct:.0f}% with no input or comm wait: too little work per step"
    if step_s is not None and step_s < TINY_STEP_WARN_S:
        return f"{who}: steps of {step_s * 1e3:.1f} ms at a small batch: mostly fixed per-step overhead"
    if exchange is not None:
        batch, now, grown = exchange
        return (
            f"{who}: too little work per step at batch {batch}: the gradient exchange takes {pct(now):.0f}% of each "
            f"step only because the step is short; at batch {BATCH_GROWTH * batch} it would be about {pct(grown):.0f}%"
        )
    return f"{who}: the GPU is busy for a small part of each step: too little work per step"


def parallelism_suggestion(rank: RankFigures, *, launch_bound: bool) -> str:
    batch = rank.hello.loader_batch_size
    bigger = f"DataLoader(batch_size={batch * 4})" if batch else "a larger batch_size"
    text = f"Give each step more work: {bigger}, scaling the learning rate with it"
    if launch_bound:
        text += "; cut per-step launch overhead with torch.compile(model, mode='reduce-overhead') (CUDA graphs)"
    return text + "; or accumulate gradients over several micro-batches inside model.no_sync()."
