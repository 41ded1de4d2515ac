"""allocation, CPU side: the job's threads wait for a CPU, measured, and who else wants one.

The measure is the run-queue wait (``/proc/<pid>/task/<tid>/schedstat``): of
the time the ranks' threads and their DataLoader workers were ready to run,
the share they waited because no CPU was free.  Measured in the ranks
themselves, so it holds on any host, and counted against the processes that
compete for the host's CPUs: the ranks, their workers, their torch threads,
and, where the dashboard samples that host, everyone else's busy processes.

When the ranks are CPU-starved, the exposed communication of CPU (gloo) ranks,
the loader wait of starved workers and a CPU rank that computes slower are
symptoms, not causes: compressing gradients or adding workers would not help.
``absorb_cpu_symptoms`` moves them under this finding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gputop.diagnose.findings import SEVERITIES, Evidence, Finding
from gputop.diagnose.grading import doc_anchor, grade_above, is_measured, largest_cost, mean_step_s
from gputop.diagnose.thresholds import (
    CPU_DEMAND_OVER_CORES,
    CPU_STARVED_CRITICAL_FRAC,
    CPU_STARVED_WARN_FRAC,
    HOST_CPU_BUSY_PCT,
    OTHER_PROCESS_CPU_PCT,
)
from gputop.diagnose.wording import pct, ranks_text
from gputop.model.figures import Figures, RankFigures
from gputop.model.samples import BusyProcess
from gputop.model.stats import median


@dataclass(frozen=True)
class HostLoad:
    """Who competes for one host's CPUs, as far as gputop can tell."""

    hostname: str
    cores: int | None
    ranks: tuple[RankFigures, ...]
    workers_per_rank: int
    threads_per_rank: int  # torch intra-op threads of one rank (1 when unknown)
    others: tuple[BusyProcess, ...]  # busy processes outside the job and gputop, busiest first
    host_cpu_pct: float | None  # None when the dashboard samples another host

    @property
    def demand_cores(self) -> float | None:
        """CPUs' worth of threads ready to run: the job's (measured in the ranks) plus the busy others'."""
        mine = [r.stats.cpu_demand_cores for r in self.ranks if r.stats.cpu_demand_cores is not None]
        if not mine:
            return None
        return sum(mine) + sum(p.cpu_pct for p in self.others) / 100.0

    @property
    def demand_per_core(self) -> float | None:
        demand = self.demand_cores
        return demand / self.cores if demand is not None and self.cores else None

    def processes_text(self) -> str:
        """'2 ranks x (1 main + 2 workers) + 1 other on 2 CPUs'."""
        parts = ["1 main"]
        if self.threads_per_rank > 1:
            parts.append(f"{self.threads_per_rank - 1} more torch threads")
        if self.workers_per_rank:
            parts.append(f"{self.workers_per_rank} worker{'s' if self.workers_per_rank != 1 else ''}")
        text = f"{len(self.ranks)} rank{'s' if len(self.ranks) != 1 else ''} x ({' + '.join(parts)})"
        if self.host_cpu_pct is not None:
            text += f" + {len(self.others)} other{'s' if len(self.others) != 1 else ''}"
        if self.cores and self.demand_cores is not None:
            return text + f" want {self.demand_cores:.1f} of {self.cores} CPUs"
        return text + (f" on {self.cores} CPUs" if self.cores else "")


def host_load(machine: Figures, hostname: str, ranks: Sequence[RankFigures]) -> HostLoad:
    """Count what runs on a host; others only from a host sample of that very host."""
    cores = max((r.hello.cpu_count for r in ranks if r.hello.cpu_count), default=None)
    host = machine.host
    job_pids = {r.hello.pid for r in ranks}
    sampled = host is not None and any(p.pid in job_pids for p in host.processes)
    others: tuple[BusyProcess, ...] = ()
    host_cpu: float | None = None
    if sampled and host is not None:
        for reading in host.processes:
            job_pids.add(reading.pid)
            job_pids.update(reading.child_pids)
        others = tuple(
            p
            for p in host.busy
            if p.pid not in job_pids and p.pid != host.gputop_pid and p.cpu_pct >= OTHER_PROCESS_CPU_PCT
        )
        host_cpu = host.cpu_pct
        cores = cores or host.cpu_count
    return HostLoad(
        hostname=hostname,
        cores=cores,
        ranks=tuple(ranks),
        # The configured count: the live one drops to 0 when a loader's iterator ends.
        workers_per_rank=max((max(r.hello.loader_num_workers or 0, r.stats.workers or 0) for r in ranks), default=0),
        threads_per_rank=max((r.hello.torch_threads or 1 for r in ranks), default=1),
        others=others,
        host_cpu_pct=host_cpu,
    )


def starved_median(ranks: Sequence[RankFigures]) -> float | None:
    """The median starved share of the measured ranks; None if none measures it."""
    return median([r.stats.cpu_starved_frac for r in ranks if is_measured(r) and r.stats.cpu_starved_frac is not None])


def contention_evidence(load: HostLoad, median_frac: float, threshold_frac: float) -> list[Evidence]:
    evidence = [Evidence("cpu_wait_pct", pct(median_frac), pct(threshold_frac), "%")]
    if load.demand_per_core is not None:
        evidence.append(Evidence("runnable_per_cpu", load.demand_per_core, CPU_DEMAND_OVER_CORES, "x"))
    main = [r.stats.main_cpu_wait_frac for r in load.ranks if r.stats.main_cpu_wait_frac is not None]
    if main:
        evidence.append(Evidence("training_thread_cpu_wait_pct", pct(max(main)), pct(threshold_frac), "%"))
    if load.host_cpu_pct is not None and load.host_cpu_pct > HOST_CPU_BUSY_PCT:
        evidence.append(Evidence("host_cpu_pct", load.host_cpu_pct, HOST_CPU_BUSY_PCT, "%"))
    for other in load.others[:3]:
        evidence.append(Evidence(f"pid_{other.pid}_{other.name}_cpu_pct", other.cpu_pct, OTHER_PROCESS_CPU_PCT, "%"))
    return evidence


def contention_title(load: HostLoad, median_frac: float) -> str:
    who = ranks_text([r.rank for r in load.ranks])
    title = f"{who} wait for a CPU {pct(median_frac):.0f}% of the time they are ready to run: {load.processes_text()}"
    if load.others:
        top = load.others[0]
        owner = f", user {top.user}" if top.user else ""
        title += f"; busiest other: pid {top.pid} ({top.name}{owner}) at {top.cpu_pct:.0f}% of a core"
    return title


def contention_suggestion(load: HostLoad) -> str:
    """Fixes that fit the counts: fewer workers or threads, the others off, more cores, pinning."""
    ranks = max(len(load.ranks), 1)
    fixes = []
    if load.cores:
        share = max(load.cores // ranks, 1)
        if load.workers_per_rank and load.workers_per_rank + 1 > share:
            fixes.append(
                f"DataLoader(num_workers={max(share - 1, 0)}): each worker is a process that wants a core, "
                f"and each rank has {share} of the {load.cores} CPUs"
            )
        if load.threads_per_rank > share:
            fixes.append(f"torch.set_num_threads({share}) in each rank (or OMP_NUM_THREADS={share})")
    if load.others:
        top = load.others[0]
        fixes.append(f"move or stop pid {top.pid} ({top.name}) and other work off the job's cores")
    fixes.append(
        "give the job more CPUs or run fewer ranks per host, and pin each rank with its workers to its own cores "
        "(taskset/numactl)"
    )
    text = "; ".join(fixes)
    return text[0].upper() + text[1:] + "."


def merge_contention(thread_finding: Finding | None, contention: Finding) -> Finding:
    """One allocation finding per host and run: the thread count's evidence beside the measured wait."""
    if thread_finding is None:
        return contention
    severity = max(thread_finding.severity, contention.severity, key=SEVERITIES.index)
    return replace(
        contention,
        severity=severity,
        evidence=thread_finding.evidence + contention.evidence,
        title=contention.title + f" ({thread_finding.title})",
        suggestion=thread_finding.suggestion + " " + contention.suggestion,
        magnitude=max(thread_finding.magnitude, contention.magnitude),
    )


def contention_finding(machine: Figures, run_id: str, hostname: str, ranks: Sequence[RankFigures]) -> Finding | None:
    """The CPU-contention finding for one run's ranks on one host, or None below the warn line."""
    median_frac = starved_median(ranks)
    severity = grade_above(median_frac, CPU_STARVED_WARN_FRAC, CPU_STARVED_CRITICAL_FRAC)
    if severity is None or median_frac is None:
        return None
    threshold = CPU_STARVED_CRITICAL_FRAC if severity == "critical" else CPU_STARVED_WARN_FRAC
    load = host_load(machine, hostname, ranks)
    demand = load.demand_per_core
    if demand is None or demand <= CPU_DEMAND_OVER_CORES:
        return None  # waiting, but not for want of cores: scheduling latency, not oversubscription
    return Finding(
        cause="allocation",
        severity=severity,
        title=contention_title(load, median_frac),
        suggestion=contention_suggestion(load),
        evidence=tuple(contention_evidence(load, median_frac, threshold)),
        ranks=tuple(sorted(r.rank for r in ranks)),
        run_id=run_id,
        doc=doc_anchor("allocation"),
        magnitude=median_frac,
        # The training thread's own wait for a CPU is step time lost outright.
        cost_s=median(
            [
                (r.stats.main_cpu_wait_frac or 0.0) * (r.stats.step_time_mean_s or 0.0)
                for r in ranks
                if r.stats.main_cpu_wait_frac is not None
            ]
        ),
        step_s=mean_step_s(ranks),
        extra={"hostname": hostname, "cpu_contention": True},
    )


def cpu_explains(finding: Finding, ranks: Sequence[RankFigures]) -> bool:
    """Whether CPU starvation explains a symptom finding on these (starved) ranks."""
    mine = [r for r in ranks if r.rank in finding.ranks]
    if not mine:
        return False
    if finding.cause == "communication":
        return all(not r.on_cuda for r in mine)  # gloo on the CPU: the all-reduce itself needs a core
    if finding.cause == "data_loading":  # starved workers; a sleeping or I/O-bound loader is not explained
        return all((r.stats.workers_cpu_starved_frac or 0.0) > CPU_STARVED_WARN_FRAC for r in mine)
    if finding.cause == "straggler":
        if finding.extra.get("phase") == "loader":
            return all((r.stats.workers_cpu_starved_frac or 0.0) > CPU_STARVED_WARN_FRAC for r in mine)
        return all(not r.on_cuda for r in mine)  # a CPU rank computing slower on a starved host
    return False


def absorb_cpu_symptoms(findings: list[Finding], machine: Figures) -> list[Finding]:
    """Fold the symptoms CPU contention explains into its allocation finding, as parallelism does for tiny steps.

    The symptoms stay listed, as info, so nothing is hidden; their severity and
    first evidence move to the allocation finding, whose fix is the one that helps.
    """
    out = list(findings)
    for index, contention in enumerate(out):
        if not contention.extra.get("cpu_contention"):
            continue
        run = next((r for r in machine.runs if r.run_id == contention.run_id), None)
        if run is None:
            continue
        ranks = [r for r in run.ranks if r.rank in contention.ranks]
        absorbed = [
            f
            for f in out
            if f.run_id == contention.run_id
            and f.cause in ("communication", "data_loading", "straggler")
            and f.severity != "info"
            and cpu_explains(f, ranks)
        ]
        if not absorbed:
            continue
        severity = max([contention.severity, *(f.severity for f in absorbed)], key=SEVERITIES.index)
        shown = ", ".join(f"{f.cause} {pct(f.magnitude):.0f}%" for f in absorbed)
        out[index] = replace(
            contention,
            severity=severity,
            evidence=contention.evidence + tuple(e for f in absorbed for e in f.evidence[:1]),
            title=contention.title + f"; it shows as {shown}",
            magnitude=max([contention.magnitude, *(f.magnitude for f in absorbed)]),
            cost_s=largest_cost([contention, *absorbed]),
        )
        out = [
            replace(f, severity="info", title=f.title + " (a symptom of CPU contention, see allocation)")
            if f in absorbed
            else f
            for f in out
        ]
    return out
