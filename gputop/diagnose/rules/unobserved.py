"""unobserved: what the tool cannot see, so the user knows where the picture has holes.

Processes on the GPUs that report to no dashboard, a multi-rank run whose DDP
timings never arrive (communication and straggler rules are then blind), ranks
that stopped reporting, and NVML being unavailable altogether.  None of these
is a slowdown by itself, so all are info; a process that competes for a job's
GPU is an allocation finding instead.
"""

from __future__ import annotations

from collections.abc import Collection

from gputop.diagnose.findings import Evidence, Finding
from gputop.diagnose.rules.allocation import gpu_label, process_text
from gputop.diagnose.thresholds import MIN_STEPS
from gputop.diagnose.wording import ranks_text
from gputop.model.figures import Figures, RunFigures


def unobserved_findings(machine: Figures, *, gpus_already_reported: Collection[tuple[str, int]] = ()) -> list[Finding]:
    """``gpus_already_reported``: (host, index) of GPUs an allocation finding named ("" this machine)."""
    findings = []
    gpu = machine.gpu
    if gpu is not None and gpu.unavailable and not machine.assignments:  # other hosts' GPUs are data
        findings.append(info(None, f"No GPU data: {gpu.unavailable}", "GPU columns show N/A; step timings still work."))
    for assignment in machine.assignments:
        if not assignment.unobserved or (assignment.hostname, assignment.gpu.index) in gpus_already_reported:
            continue
        index = assignment.gpu.index
        runs = sorted({v.run_id for v in assignment.ranks})
        findings.append(
            Finding(
                cause="unobserved",
                severity="info",
                title=f"{gpu_label(assignment)}: "
                + ", ".join(process_text(p) for p in assignment.unobserved[:3])
                + (f" and {len(assignment.unobserved) - 3} more" if len(assignment.unobserved) > 3 else "")
                + " not reporting",
                suggestion="If it is a training job, add gputop.watch(model) to it to see its steps here.",
                evidence=(Evidence("unreported_processes", len(assignment.unobserved), 0, gpu=index),),
                gpus=(index,),
                run_id=runs[0] if len(runs) == 1 else None,
                hostname=assignment.hostname or None,
            )
        )
    for run in machine.runs:
        findings += run_blind_spots(run)
    return findings


def run_blind_spots(run: RunFigures) -> list[Finding]:
    findings = []
    if run.world_size > 1:
        blind = [r for r in run.active if r.stats.steps >= MIN_STEPS and r.stats.phases.comm_s is None]
        if blind and len(blind) == len([r for r in run.active if r.stats.steps >= MIN_STEPS]):
            findings.append(
                info(
                    run.run_id,
                    f"{ranks_text([r.rank for r in blind])}: no forward, backward or communication timings",
                    "Communication and straggler diagnosis need them. gputop reads them from DDP's logger, and for "
                    "any other stack (FSDP2, DTensor, DeepSpeed) times them from the watched model's hooks and the "
                    "collectives torch.distributed issues, on the CPU; on CUDA that needs CUDA events, which it does "
                    "not record yet. Call gputop.watch(model) after init_process_group and after wrapping the model.",
                    ranks=[r.rank for r in blind],
                )
            )
    if run.lost:
        findings.append(
            info(
                run.run_id,
                f"{ranks_text([v.rank for v in run.lost])} stopped reporting ({run.lost[0].snapshot.status_reason})",
                "A hung or crashed rank stalls the others in their next all-reduce: check its log.",
                ranks=[v.rank for v in run.lost],
            )
        )
    return findings


def info(run_id: str | None, title: str, suggestion: str, *, ranks: Collection[int] = ()) -> Finding:
    return Finding(
        cause="unobserved",
        severity="info",
        title=title,
        suggestion=suggestion,
        ranks=tuple(sorted(ranks)),
        run_id=run_id,
    )
