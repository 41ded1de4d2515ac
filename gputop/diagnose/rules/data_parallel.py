"""data_parallel: ``nn.DataParallel`` making its first GPU do the others' gathering.

DataParallel runs one process that scatters each batch to its GPUs, replicates
the model on every step, and gathers outputs (and the loss's gradients) back on
the first device.  That GPU then carries more memory and more work than the
rest, and the others wait for it.  PyTorch's own documentation recommends
DistributedDataParallel instead, even on one machine.  The evidence is the skew
NVML sees across the rank's GPUs: utilization and memory of the first against
the mean of the others.
"""

from __future__ import annotations

from statistics import mean

from gputop.diagnose.details import DataParallelDetails
from gputop.diagnose.findings import Evidence, Finding
from gputop.model.figures import Figures, RankFigures
from gputop.model.join import normalize_uuid, rank_gpu_uuids
from gputop.model.samples import GpuReading

# Sources: the PyTorch "CUDA semantics" best practices ("use DistributedDataParallel
# instead of DataParallel") and the DataParallel docs' note on the first device's
# imbalance.  The lines are ours: 15 points of utilization or a quarter more memory
# is past the noise of identical replicas, which differ by a few points at most.
DP_UTIL_SKEW_PTS = 15.0
DP_MEM_SKEW_RATIO = 1.25
GIB = float(1 << 30)


def data_parallel_findings(machine: Figures) -> list[Finding]:
    """One warn per DataParallel rank whose first GPU is busier or fuller than its others."""
    by_uuid = {normalize_uuid(a.gpu.uuid): a.gpu for a in machine.assignments}
    findings = []
    for run in machine.runs:
        for rank in run.active:
            finding = _rank_finding(rank, by_uuid, machine.gpu_util_pct)
            if finding is not None:
                findings.append(finding)
    return findings


def _rank_finding(rank: RankFigures, by_uuid: dict[str, GpuReading], util_of: dict[str, float]) -> Finding | None:
    uuids = rank_gpu_uuids(rank.snapshot)
    gpus = [by_uuid[u] for u in uuids if u in by_uuid]
    if not rank.hello.data_parallel or len(gpus) < 2:
        return None
    first, others = gpus[0], gpus[1:]
    evidence = []
    utils = [util_of.get(g.uuid, g.util_pct) for g in gpus]
    if all(u is not None for u in utils):
        skew = float(utils[0] or 0.0) - mean(float(u or 0.0) for u in utils[1:])
        if skew > DP_UTIL_SKEW_PTS:
            evidence.append(Evidence("first_gpu_util_skew_pts", skew, DP_UTIL_SKEW_PTS, " pts", gpu=first.index))
    mems = [g.mem_used_bytes for g in gpus]
    if all(m is not None for m in mems) and mean(m or 0 for m in mems[1:]) > 0:
        ratio = (mems[0] or 0) / mean(m or 0 for m in mems[1:])
        if ratio > DP_MEM_SKEW_RATIO:
            evidence.append(Evidence("first_gpu_mem_ratio", ratio, DP_MEM_SKEW_RATIO, "x", gpu=first.index))
    if not evidence:
        return None
    indices = ", ".join(str(g.index) for g in others)
    return Finding(
        cause="model_config",
        severity="warn",
        title=(
            f"rank {rank.rank} runs nn.DataParallel on {len(gpus)} GPUs and GPU {first.index} "
            f"gathers for GPUs {indices}"
        ),
        suggestion=(
            f"use DistributedDataParallel, one process per GPU: torchrun --nproc_per_node={len(gpus)} train.py "
            "with DDP(model, device_ids=[local_rank]); no scatter, replicate and gather through one GPU each step"
        ),
        evidence=tuple(evidence),
        ranks=(rank.rank,),
        gpus=tuple(g.index for g in gpus),
        run_id=rank.run_id,
        magnitude=max(e.value / e.threshold for e in evidence) - 1.0,
        details=DataParallelDetails(first_gpu=first.index),
    )
