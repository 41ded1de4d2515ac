"""communication: all ranks alike wait for the gradient exchange, beyond what backward hides.

Graded on exposed communication (DDP's all-reduce time minus its overlap with
backward compute, or, for any other stack, the time the training thread was
blocked in the collectives it issued) as a share of wall step time, on the rank that waits least:
a straggler makes the others wait but not itself, so "all ranks alike" is the
minimum.  One slow rank is the straggler rule's business.
"""

from __future__ import annotations

from collections.abc import Sequence

from gputop.diagnose.details import CommunicationDetails
from gputop.diagnose.findings import Evidence, Finding
from gputop.diagnose.grading import BAND_ERRORS, grade_band, mean_step_s, measured
from gputop.diagnose.thresholds import (
    COLLECTIVE_NAMED_PART,
    COLLECTIVES_NAMED,
    EXPOSED_COMM_CRITICAL_FRAC,
    EXPOSED_COMM_WARN_FRAC,
    TENSOR_PARALLEL_GROUPS,
)
from gputop.diagnose.wording import pct, ranks_text, too_close_text
from gputop.model.collectives import CollectiveFigures, size_text
from gputop.model.figures import RankFigures, RunFigures


def communication_findings(run: RunFigures) -> list[Finding]:
    """All ranks alike spend a large share of the step in exposed gradient exchange.

    Graded on the rank that waits least: a straggler makes the others wait, but
    not itself, so "all ranks alike" is the minimum, not the mean.
    """
    if run.world_size <= 1:
        return []
    ranks = [r for r in measured(run) if r.stats.phases.exposed_comm_frac is not None]
    if len(ranks) < 2 or len(ranks) < len(measured(run)):
        return []  # "all ranks alike" needs every measured rank's figure
    fracs = [r.stats.phases.exposed_comm_frac or 0.0 for r in ranks]
    least = min(fracs)
    lowest = min(ranks, key=lambda r: r.stats.phases.exposed_comm_frac or 0.0)
    se = lowest.stats.phases.exposed_comm_frac_se
    severity, close = grade_band(least, se, EXPOSED_COMM_WARN_FRAC, EXPOSED_COMM_CRITICAL_FRAC)
    if severity is None and not close:
        return []
    threshold = EXPOSED_COMM_CRITICAL_FRAC if severity == "critical" else EXPOSED_COMM_WARN_FRAC
    mean = sum(fracs) / len(fracs)
    spread = None if se is None else pct(BAND_ERRORS * se)
    evidence = (Evidence("exposed_comm_pct", pct(least), pct(threshold), "%", rank=lowest.rank, spread=spread),)
    held_by = holding_collectives(lowest)
    # DDP's exchange is its gradient all-reduce (its logger's row among the collectives): it keeps that name.
    what = "gradient exchange" if not held_by or lowest.stats.phases.source == "ddp" else "communication"
    title = f"{ranks_text([r.rank for r in ranks])} wait for {what} {pct(mean):.0f}% of each step"
    if held_by:
        title += ", most in " + " and ".join(collective_text(c) for c in held_by)
    if severity is None:
        title += f": {too_close_text(least, se, threshold, lowest.stats.steps)}"
    nvlink = nvlink_bytes_s(ranks)
    if nvlink is not None:
        title += f" (NVLink {nvlink / 1e9:.1f} GB/s per GPU)"
    comm = [r.stats.phases.comm_s for r in ranks if r.stats.phases.comm_s]
    overlap = [r.stats.phases.overlap_s or 0.0 for r in ranks if r.stats.phases.comm_s]
    hidden_frac = sum(overlap) / sum(c for c in comm if c) if comm else None
    return [
        Finding(
            cause="communication",
            severity=severity or "info",
            title=title,
            suggestion=communication_suggestion(ranks[0], held_by),
            evidence=evidence,
            ranks=tuple(sorted(r.rank for r in ranks)),
            run_id=run.run_id,
            magnitude=mean,
            # Exposed comm that every rank pays (the least of them) is what the exchange costs each step.
            cost_s=min(r.stats.phases.exposed_comm_s or 0.0 for r in ranks),
            step_s=mean_step_s(ranks),
            details=CommunicationDetails(
                hidden_frac=hidden_frac, nvlink_bytes_s=nvlink, collectives=tuple(c.name for c in held_by)
            ),
        )
    ]


def nvlink_bytes_s(ranks: list[RankFigures]) -> float | None:
    """The NVLink traffic (both ways) of the ranks' GPUs, mean per GPU; None where no GPU reads NVLink.

    On SXM/NVSwitch nodes NCCL's all-reduce goes over NVLink, not PCIe: this is
    the exchange itself, measured by the driver's counters.
    """
    rates = {
        r.gpu.uuid: r.gpu.nvlink_rx_bytes_s + r.gpu.nvlink_tx_bytes_s
        for r in ranks
        if r.gpu is not None and r.gpu.nvlink_rx_bytes_s is not None and r.gpu.nvlink_tx_bytes_s is not None
    }
    return sum(rates.values()) / len(rates) if rates else None


def holding_collectives(rank: RankFigures) -> list[CollectiveFigures]:
    """The collectives that hold the rank up: the most exposed, and any other with a fair part of its exposed time."""
    timed = [c for c in rank.stats.collectives if c.exposed_s]
    total = sum(c.exposed_s or 0.0 for c in timed)
    if not timed or total <= 0:
        return []
    return [c for c in timed[:COLLECTIVES_NAMED] if (c.exposed_s or 0.0) >= COLLECTIVE_NAMED_PART * total]


def collective_text(c: CollectiveFigures) -> str:
    """``all_gather on dp (4.7 a step, 444 KiB each, 26.4 ms exposed)``."""
    exposed_ms = 1e3 * (c.exposed_s or 0.0)
    return f"{c.name} ({c.calls:.3g} a step, {size_text(c.bytes_each)} each, {exposed_ms:.1f} ms exposed)"


def communication_suggestion(rank: RankFigures, held_by: Sequence[CollectiveFigures] = ()) -> str:
    hello = rank.hello
    if rank.on_cuda and hello.backend == "gloo":
        return "Use the NCCL backend for CUDA tensors: init_process_group('nccl')."
    top = held_by[0] if held_by else None
    if top is not None and top.group in TENSOR_PARALLEL_GROUPS:
        return (
            f"The tensor-parallel group's {top.kind} is on the critical path of every layer: keep the '{top.group}' "
            "dimension within a node (the innermost mesh dimension, on NVLink), shrink it and grow data parallelism "
            "instead, or overlap it (async tensor parallelism under torch.compile)."
        )
    if top is not None and top.kind == "all_gather":
        return (
            "Parameters are gathered while the forward or backward waits: prefetch the next block's all-gather "
            "(FSDP2 does one by default; set_modules_to_forward_prefetch / set_modules_to_backward_prefetch for "
            "more), keep the last blocks and the root unsharded after forward (fully_shard(..., "
            "reshard_after_forward=False)), or raise the per-rank batch so compute hides the gathers."
        )
    if top is not None and top.kind == "reduce_scatter":
        return (
            "Gradients are reduce-scattered while backward waits: raise the per-rank batch so backward hides it, "
            "reduce in bf16 (MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)), and under gradient accumulation "
            "skip it on the steps that do not step the optimizer (model.set_requires_gradient_sync(False))."
        )
    return (
        "Exchange gradients less often or in less data: accumulate gradients over k steps inside "
        "model.no_sync(), compress them with model.register_comm_hook(None, bf16_compress_hook), or raise "
        "the per-rank batch size; DDP(bucket_cap_mb=...) tunes how well the exchange overlaps backward."
    )
