"""communication: all ranks alike wait for the gradient exchange, beyond what backward hides.

Graded on exposed communication (DDP's all-reduce time minus its overlap with
backward compute) as a share of wall step time, on the rank that waits least:
a straggler makes the others wait but not itself, so "all ranks alike" is the
minimum.  One slow rank is the straggler rule's business.
"""

from __future__ import annotations

from gputop.diagnose.findings import Evidence, Finding
from gputop.diagnose.grading import BAND_ERRORS, doc_anchor, grade_band, mean_step_s, measured
from gputop.diagnose.thresholds import EXPOSED_COMM_CRITICAL_FRAC, EXPOSED_COMM_WARN_FRAC
from gputop.diagnose.wording import pct, ranks_text, too_close_text
from gputop.model.figures import RankFigures, RunFigures


def communication_findings(run: RunFigures) -> list[Finding]:
    """All ranks alike spend a large share of the step in exposed gradient exchange.

    Graded on the rank that waits least: a straggler makes the others wait, but
    not itself, so "all ranks alike" is the minimum, not the mean.
    """
    if run.world_size <= 1:
        return []
    ranks = [r for r in measured(run) if r.stats.exposed_comm_frac is not None]
    if len(ranks) < 2 or len(ranks) < len(measured(run)):
        return []  # "all ranks alike" needs every measured rank's figure
    fracs = [r.stats.exposed_comm_frac or 0.0 for r in ranks]
    least = min(fracs)
    lowest = min(ranks, key=lambda r: r.stats.exposed_comm_frac or 0.0)
    se = lowest.stats.exposed_comm_frac_se
    severity, close = grade_band(least, se, EXPOSED_COMM_WARN_FRAC, EXPOSED_COMM_CRITICAL_FRAC)
    if severity is None and not close:
        return []
    threshold = EXPOSED_COMM_CRITICAL_FRAC if severity == "critical" else EXPOSED_COMM_WARN_FRAC
    mean = sum(fracs) / len(fracs)
    spread = None if se is None else pct(BAND_ERRORS * se)
    evidence = (Evidence("exposed_comm_pct", pct(least), pct(threshold), "%", rank=lowest.rank, spread=spread),)
    title = f"{ranks_text([r.rank for r in ranks])} wait for gradient exchange {pct(mean):.0f}% of each step"
    if severity is None:
        title += f": {too_close_text(least, se, threshold, lowest.stats.steps)}"
    nvlink = nvlink_bytes_s(ranks)
    if nvlink is not None:
        title += f" (NVLink {nvlink / 1e9:.1f} GB/s per GPU)"
    comm = [r.stats.comm_s for r in ranks if r.stats.comm_s]
    overlap = [r.stats.overlap_s or 0.0 for r in ranks if r.stats.comm_s]
    hidden_frac = sum(overlap) / sum(c for c in comm if c) if comm else None
    return [
        Finding(
            cause="communication",
            severity=severity or "info",
            title=title,
            suggestion=communication_suggestion(ranks[0]),
            evidence=evidence,
            ranks=tuple(sorted(r.rank for r in ranks)),
            run_id=run.run_id,
            doc=doc_anchor("communication"),
            magnitude=mean,
            # Exposed comm that every rank pays (the least of them) is what the exchange costs each step.
            cost_s=min(r.stats.exposed_comm_s or 0.0 for r in ranks),
            step_s=mean_step_s(ranks),
            extra={"comm_hidden_frac": hidden_frac, "nvlink_bytes_s": nvlink},
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


def communication_suggestion(rank: RankFigures) -> str:
    hello = rank.hello
    if rank.on_cuda and hello.backend == "gloo":
        return "Use the NCCL backend for CUDA tensors: init_process_group('nccl')."
    return (
        "Exchange gradients less often or in less data: accumulate gradients over k steps inside "
        "model.no_sync(), compress them with model.register_comm_hook(None, bf16_compress_hook), or raise "
        "the per-rank batch size; DDP(bucket_cap_mb=...) tunes how well the exchange overlaps backward."
    )
