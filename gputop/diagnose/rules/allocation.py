"""allocation: GPUs and CPUs assigned badly to the job.

GPU side, from the rank-to-GPU join: GPUs no one uses while a job runs beside
them, two ranks on one GPU, other processes computing on the job's GPUs.  CPU
side: the ranks' measured wait for a CPU (``cpu_contention``), beside more
torch compute threads across the ranks on a host than it has cores (the
oversubscribed case), from each rank's hello and, where the host sampler sees
those ranks, the host's load.
"""

from __future__ import annotations

from collections import defaultdict

from gputop.diagnose.findings import Evidence, Finding, Severity
from gputop.diagnose.grading import grade_above
from gputop.diagnose.rules.cpu_contention import contention_finding, merge_contention
from gputop.diagnose.thresholds import (
    HOST_CPU_BUSY_PCT,
    OTHER_PROCESS_MIN_BYTES,
    OTHER_PROCESS_SM_PCT,
    THREADS_PER_CORE_CRITICAL,
    THREADS_PER_CORE_WARN,
)
from gputop.diagnose.wording import ranks_text
from gputop.model.figures import Figures, RankFigures, RunFigures
from gputop.model.join import GpuAssignment
from gputop.model.samples import GpuProcess, HostSample
from gputop.model.snapshot import RankSnapshot

MIB = float(1 << 20)


def allocation_findings(machine: Figures) -> list[Finding]:
    return cpu_findings(machine) + gpu_allocation_findings(machine)


def cpu_findings(machine: Figures) -> list[Finding]:
    """Per host and run: the measured CPU wait, with the torch-thread count beside it; one finding each."""
    by_host = ranks_by_host(machine)
    threads = {(f.hostname, f.run_id): f for f in oversubscription_findings(machine, by_host)}
    findings = []
    for hostname, members in by_host.items():
        for run in {id(run): run for run, _ in members}.values():
            ranks = [r for owner, r in members if owner is run]
            thread_finding = threads.pop((hostname, run.run_id), None)
            contention = contention_finding(machine, run.run_id, hostname, ranks)
            if contention is not None:
                findings.append(merge_contention(thread_finding, contention))
            elif thread_finding is not None:
                findings.append(thread_finding)
    return findings


def ranks_by_host(machine: Figures) -> dict[str, list[tuple[RunFigures, RankFigures]]]:
    """Every live rank (of every run) under its host: they share its CPUs."""
    by_host: dict[str, list[tuple[RunFigures, RankFigures]]] = defaultdict(list)
    for run in machine.runs:
        for rank in run.active:
            by_host[rank.hello.hostname].append((run, rank))
    return by_host


def oversubscription_findings(
    machine: Figures, by_host: dict[str, list[tuple[RunFigures, RankFigures]]]
) -> list[Finding]:
    """Per host: torch threads of all live ranks (of every run) against the host's cores."""
    findings = []
    for hostname, members in by_host.items():
        counted = [(run, r) for run, r in members if r.hello.torch_threads is not None]
        cores = max((r.hello.cpu_count for _, r in members if r.hello.cpu_count), default=None)
        if not counted or not cores or len(counted) < len(members):
            continue  # a rank with unknown threads could be any number: no total to compare
        threads = sum(r.hello.torch_threads or 0 for _, r in counted)
        ratio = threads / cores
        severity = grade_above(ratio, THREADS_PER_CORE_WARN, THREADS_PER_CORE_CRITICAL)
        if severity is None:
            continue
        line = THREADS_PER_CORE_CRITICAL if severity == "critical" else THREADS_PER_CORE_WARN
        evidence = [Evidence("torch_threads_per_core", ratio, line, "x")]
        evidence += host_load_evidence(machine.host, [r for _, r in members], cores)
        per_rank = sorted({r.hello.torch_threads or 0 for _, r in counted})
        each = str(per_rank[0]) if len(per_rank) == 1 else "up to " + str(per_rank[-1])
        fair_share = max(cores // len(counted), 1)
        where = f" on {hostname}" if hostname else ""
        for run in {id(run): run for run, _ in members}.values():
            ranks = sorted(r.rank for owner, r in members if owner is run)
            findings.append(
                Finding(
                    cause="allocation",
                    severity=severity,
                    title=(
                        f"{len(counted)} ranks x {each} torch threads = {threads} threads{where} "
                        f"for {cores} CPUs: oversubscribed"
                    ),
                    suggestion=(
                        f"torch.set_num_threads({fair_share}) in each rank (or OMP_NUM_THREADS={fair_share}), "
                        f"so ranks x threads <= {cores} CPUs."
                    ),
                    evidence=tuple(evidence),
                    ranks=tuple(ranks),
                    run_id=run.run_id,
                    magnitude=1 - cores / threads,
                    hostname=hostname,
                )
            )
    return findings


def host_load_evidence(host: HostSample | None, ranks: list[RankFigures], cores: int) -> list[Evidence]:
    """The host's load as corroboration, when the host sampler watches these very ranks."""
    if host is None:
        return []
    sampled = {p.pid for p in host.processes}
    if not any(r.hello.pid in sampled for r in ranks):
        return []  # the dashboard's host is another machine: its load says nothing about this one
    evidence = []
    if host.load_1m is not None and host.load_1m / cores > THREADS_PER_CORE_WARN:
        evidence.append(Evidence("load_1m_per_cpu", host.load_1m / cores, THREADS_PER_CORE_WARN, "x"))
    if host.cpu_pct is not None and host.cpu_pct > HOST_CPU_BUSY_PCT:
        evidence.append(Evidence("host_cpu_pct", host.cpu_pct, HOST_CPU_BUSY_PCT, "%"))
    return evidence


def significant(process: GpuProcess) -> bool:
    """A process that computes or holds real memory on the GPU (not an idle context)."""
    return (process.sm_util_pct or 0.0) > OTHER_PROCESS_SM_PCT or (process.used_bytes or 0) >= OTHER_PROCESS_MIN_BYTES


def gpu_allocation_findings(machine: Figures) -> list[Finding]:
    """Ranks that share a GPU, a GPU shared with another run or process, and GPUs no rank or process uses."""
    findings: list[Finding] = []
    live = {(run.run_id, r.rank) for run in machine.runs for r in run.active}
    parents = {a.gpu.mig_parent_uuid for a in machine.assignments if a.gpu.mig_parent_uuid}
    job_gpus: dict[str, list[GpuAssignment]] = defaultdict(list)
    idle: list[GpuAssignment] = []
    for assignment in machine.assignments:
        ranks = [v for v in assignment.ranks if (v.run_id, v.rank) in live]
        runs = sorted({v.run_id for v in ranks})
        for run_id in runs:
            job_gpus[run_id].append(assignment)
        gpu = assignment.gpu
        unreadable = gpu.util_pct is None and bool(gpu.na)  # lost or refusing: we can't say it is idle
        if not ranks and not assignment.gpu.processes and gpu.uuid not in parents:
            if not unreadable:
                idle.append(assignment)
            continue
        for run_id in runs:
            findings += shared_gpu_findings(assignment, run_id, ranks, runs)
    if idle and job_gpus:
        findings.append(idle_gpus_finding(idle, job_gpus))
    return findings


def shared_gpu_findings(
    assignment: GpuAssignment, run_id: str, ranks: list[RankSnapshot], runs: list[str]
) -> list[Finding]:
    """On one GPU, for one run: its ranks that share it, and the other runs and processes it shares it with."""
    gpu = assignment.gpu
    out = []
    same = sorted(v.rank for v in ranks if v.run_id == run_id)
    if len(same) > 1:
        out.append(
            gpu_finding(
                run_id,
                "warn",
                f"{ranks_text(same)} share {gpu_label(assignment)}",
                "Give each rank its own GPU: torch.cuda.set_device(local_rank) before creating the model, "
                "and launch at most as many ranks per node as GPUs.",
                (Evidence("ranks_on_gpu", len(same), 1, gpu=gpu.index),),
                same,
                gpu.index,
                assignment.hostname,
            )
        )
    others = sorted(set(runs) - {run_id})
    busy = [p for p in assignment.unobserved if significant(p)]
    if others or busy:
        what = [f"run {o}" for o in others] + [process_text(p) for p in busy]
        out.append(
            gpu_finding(
                run_id,
                "warn",
                f"{gpu_label(assignment)} is shared with " + ", ".join(what),
                "Run other jobs on other GPUs (CUDA_VISIBLE_DEVICES), or stop them: the GPU time-slices "
                "between processes.",
                (Evidence("other_processes", len(others) + len(busy), 0, gpu=gpu.index),),
                same,
                gpu.index,
                assignment.hostname,
            )
        )
    return out


def idle_gpus_finding(idle: list[GpuAssignment], job_gpus: dict[str, list[GpuAssignment]]) -> Finding:
    """Idle GPUs on a machine where a job runs: attached to the job when there is exactly one."""
    owner: str | None = next(iter(job_gpus)) if len(job_gpus) == 1 else None
    indexes = sorted(a.gpu.index for a in idle)
    hosts = sorted({a.hostname for a in idle})
    # Per node: the GPUs the job uses there plus the idle ones is what --nproc_per_node could be.
    per_node = {
        host: len({a.gpu.uuid for gpus in job_gpus.values() for a in gpus if a.hostname == host})
        + sum(1 for a in idle if a.hostname == host)
        for host in hosts
    }
    nproc = str(per_node[hosts[0]]) if len(set(per_node.values())) == 1 else "<GPUs per node>"
    where = ", ".join(map(str, indexes))
    if hosts != [""]:  # GPUs of several hosts (node samplers): indices repeat, so name the host
        where = "; ".join(
            f"{host or 'here'} {', '.join(str(a.gpu.index) for a in idle if a.hostname == host)}" for host in hosts
        )
    return Finding(
        cause="allocation",
        severity="warn",
        title=f"GPU{'s' if len(indexes) > 1 else ''} {where} idle: "
        f"no rank and no process on {'them' if len(indexes) > 1 else 'it'}",
        suggestion=f"Use them: torchrun --nproc_per_node={nproc} (one rank per GPU), "
        "or leave them to another job on purpose.",
        evidence=(Evidence("idle_gpus", len(indexes), 0),),
        gpus=tuple(indexes),
        run_id=owner,
    )


def gpu_finding(
    run_id: str,
    severity: Severity,
    title: str,
    suggestion: str,
    evidence: tuple[Evidence, ...],
    ranks: list[int],
    gpu: int,
    hostname: str = "",
) -> Finding:
    return Finding(
        cause="allocation",
        severity=severity,
        title=title,
        suggestion=suggestion,
        evidence=evidence,
        ranks=tuple(ranks),
        gpus=(gpu,),
        run_id=run_id,
        hostname=hostname or None,
    )


def gpu_label(assignment: GpuAssignment) -> str:
    """ "GPU 3", or "node-7 GPU 3" for another host's GPU (indices repeat across hosts)."""
    index = assignment.gpu.index
    return f"{assignment.hostname} GPU {index}" if assignment.hostname else f"GPU {index}"


def process_text(process: GpuProcess) -> str:
    """'pid 4242 (python, 31% SM, 2048 MiB)' with whatever NVML could read."""
    parts = [process.name] if process.name else []
    if process.sm_util_pct is not None:
        parts.append(f"{process.sm_util_pct:.0f}% SM")
    if process.used_bytes is not None:
        parts.append(f"{process.used_bytes / MIB:.0f} MiB")
    return f"pid {process.pid}" + (f" ({', '.join(parts)})" if parts else "")
