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
``contention_explains`` says which (a row of ``gputop.diagnose.symptoms``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gputop.diagnose.details import AllocationDetails, StragglerDetails
from gputop.diagnose.findings import SEVERITIES, Evidence, Finding
from gputop.diagnose.grading import grade_above, is_measured, mean_step_s
from gputop.diagnose.rules.rotating import is_rotation
from gputop.diagnose.thresholds import (
    CPU_DEMAND_OVER_CORES,
    CPU_STARVED_CRITICAL_FRAC,
    CPU_STARVED_WARN_FRAC,
    HOST_CPU_BUSY_PCT,
    OTHER_PROCESS_CPU_PCT,
    OUTSIDE_COMPETITOR_CPU_PCT,
)
from gputop.diagnose.wording import pct, ranks_text
from gputop.model.figures import Figures, RankFigures
from gputop.model.samples import BusyProcess, HostSample
from gputop.model.statistics import median


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
        mine = [r.stats.cpu.demand_cores for r in self.ranks if r.stats.cpu.demand_cores is not None]
        if not mine:
            return None
        return sum(mine) + sum(p.demand_pct for p in self.others) / 100.0

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
    """Count what runs on a host; others from the span's host samples of that very host, averaged."""
    cores = max((r.hello.cpu_count for r in ranks if r.hello.cpu_count), default=None)
    job_pids = {r.hello.pid for r in ranks}
    launchers = {r.hello.parent_pid for r in ranks if r.hello.parent_pid}  # torchrun's agent is the job's own
    since_t = None if machine.span_s is None else machine.t - machine.span_s
    # The samples that saw these ranks: a report's last sample comes after the ranks exited.
    samples = [
        h
        for h in machine.snapshot.host_history
        if (since_t is None or h.t >= since_t) and any(p.pid in job_pids for p in h.processes)
    ]
    others: tuple[BusyProcess, ...] = ()
    host_cpu: float | None = None
    if samples:
        for h in samples:
            for reading in h.processes:
                job_pids.add(reading.pid)
                job_pids.update(reading.child_pids)
        others = busy_others(samples, job_pids | launchers)
        known = [h.cpu_pct for h in samples if h.cpu_pct is not None]
        host_cpu = sum(known) / len(known) if known else None
        cores = cores or samples[-1].cpu_count
    return HostLoad(
        hostname=hostname,
        cores=cores,
        ranks=tuple(ranks),
        # The configured count: the live one drops to 0 when a loader's iterator ends.
        workers_per_rank=max(
            (max(r.hello.loader_num_workers or 0, r.stats.cpu.workers or 0) for r in ranks), default=0
        ),
        threads_per_rank=max((r.hello.torch_threads or 1 for r in ranks), default=1),
        others=others,
        host_cpu_pct=host_cpu,
    )


def busy_others(samples: Sequence[HostSample], job_pids: set[int]) -> tuple[BusyProcess, ...]:
    """Processes outside the job and gputop, busiest first, by their mean CPU from the sample that first lists them.

    Absent from a later sample counts 0 (it ended, or went quiet).  Counting
    from its first sample, not the span's: a program started after the job (the
    usual neighbour) would otherwise read at the share of the span it ran, and
    one that burned a whole core for half of it at half a core.
    """
    seen: dict[int, BusyProcess] = {}
    used: dict[int, float] = {}
    waited: dict[int, float | None] = {}
    first: dict[int, int] = {}
    for index, h in enumerate(samples):
        for p in h.busy:
            if p.pid in job_pids or p.pid == h.gputop_pid:
                continue
            seen[p.pid] = p
            used[p.pid] = used.get(p.pid, 0.0) + p.cpu_pct
            before = waited.get(p.pid, 0.0)
            waited[p.pid] = None if before is None or p.wait_pct is None else before + p.wait_pct
            first.setdefault(p.pid, index)
    count = {pid: len(samples) - first[pid] for pid in used}
    return tuple(
        BusyProcess(
            pid=pid,
            name=seen[pid].name,
            command=seen[pid].command,
            cpu_pct=round(used[pid] / count[pid], 1),
            user=seen[pid].user,
            wait_pct=None if waited[pid] is None else round((waited[pid] or 0.0) / count[pid], 1),
        )
        for pid in sorted(used, key=lambda pid: -used[pid] / count[pid])
        if used[pid] / count[pid] >= OTHER_PROCESS_CPU_PCT
    )


def starved_median(ranks: Sequence[RankFigures]) -> float | None:
    """The median starved share of the measured ranks; None if none measures it."""
    return median([r.stats.cpu.starved_frac for r in ranks if is_measured(r) and r.stats.cpu.starved_frac is not None])


def contention_evidence(
    load: HostLoad, ranks: Sequence[RankFigures], median_frac: float, threshold_frac: float
) -> list[Evidence]:
    evidence = [Evidence("cpu_wait_pct", pct(median_frac), pct(threshold_frac), "%")]
    demand = load.demand_per_core
    if demand is not None:  # shown with the comparison it makes: a neighbour alone may be the want of cores
        op = ">" if demand > CPU_DEMAND_OVER_CORES else "<="
        evidence.append(Evidence("runnable_per_cpu", demand, CPU_DEMAND_OVER_CORES, "x", op=op))
    main = [r.stats.cpu.main_wait_frac for r in ranks if r.stats.cpu.main_wait_frac is not None]
    if main:  # corroboration: shown with the comparison it makes, crossed or not
        op = ">" if max(main) > threshold_frac else "<="
        evidence.append(Evidence("training_thread_cpu_wait_pct", pct(max(main)), pct(threshold_frac), "%", op=op))
    if load.host_cpu_pct is not None and load.host_cpu_pct > HOST_CPU_BUSY_PCT:
        evidence.append(Evidence("host_cpu_pct", load.host_cpu_pct, HOST_CPU_BUSY_PCT, "%"))
    for other in load.others[:3]:
        evidence.append(Evidence(f"pid_{other.pid}_{other.name}_cpu_pct", other.cpu_pct, OTHER_PROCESS_CPU_PCT, "%"))
    return evidence


def contention_title(load: HostLoad, ranks: Sequence[RankFigures], median_frac: float) -> str:
    who = ranks_text([r.rank for r in ranks])
    verb = "waits" if len(ranks) == 1 else "wait"
    they = "it is" if len(ranks) == 1 else "they are"
    title = f"{who} {verb} for a CPU {pct(median_frac):.0f}% of the time {they} ready to run: {load.processes_text()}"
    if load.others:
        top = load.others[0]
        owner = f", user {top.user}" if top.user else ""
        title += f"; busiest other: pid {top.pid} ({top.command or top.name}{owner}) at {top.cpu_pct:.0f}% of a core"
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
            fixes.append(
                f"call torch.set_num_threads({share}) in each rank (or OMP_NUM_THREADS={share}), so ranks x threads "
                f"<= {load.cores} CPUs"
            )
    if load.others:
        top = load.others[0]
        fixes.append(f"move or stop pid {top.pid} ({top.command or top.name}) and other work off the job's cores")
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
        suggestion=contention.suggestion,  # which holds the thread count's fix (contention_suggestion): said once
        magnitude=max(thread_finding.magnitude, contention.magnitude),
    )


def starved_ranks(
    machine: Figures, hostname: str, ranks: Sequence[RankFigures]
) -> tuple[list[RankFigures], HostLoad] | None:
    """The ranks that wait for a CPU for want of cores, and the host's load; None when none does.

    Either the job's ranks as a whole wait past the line (their median) while
    more threads want to run than there are cores, or a process outside the job
    takes at least ``OUTSIDE_COMPETITOR_CPU_PCT`` of a core, more is wanted than
    the host has, and the ranks past the line wait behind it: a neighbour on one
    core of a 2-core host starves the rank that shares that core, and the other
    rank only waits for that one.  With fewer threads ready than cores, a rank
    that mostly sleeps (for a batch, say) can wait a third of its little ready
    time for wake-up latency alone: no neighbour is to blame for that.
    """
    measured_ranks = [r for r in ranks if is_measured(r) and r.stats.cpu.starved_frac is not None]
    if not measured_ranks:
        return None
    median_frac = starved_median(measured_ranks)
    over = [r for r in measured_ranks if (r.stats.cpu.starved_frac or 0.0) > CPU_STARVED_WARN_FRAC]
    if not over:
        return None
    load = host_load(machine, hostname, ranks)
    demand = load.demand_per_core
    if demand is None:
        return None  # no rank measures what it wants: nothing to weigh the wait against
    if median_frac is not None and median_frac > CPU_STARVED_WARN_FRAC and demand > CPU_DEMAND_OVER_CORES:
        return measured_ranks, load
    if load.others and load.others[0].cpu_pct >= OUTSIDE_COMPETITOR_CPU_PCT and demand > 1.0:
        return over, load  # more wanted than there is, and a neighbour takes a good part of it
    return None  # waiting, but not for want of cores: scheduling latency, not oversubscription


def contention_finding(machine: Figures, run_id: str, hostname: str, ranks: Sequence[RankFigures]) -> Finding | None:
    """The CPU-contention finding for one run's ranks on one host, or None below the warn line."""
    found = starved_ranks(machine, hostname, ranks)
    if found is None:
        return None
    ranks, load = found
    median_frac = starved_median(ranks)
    severity = grade_above(median_frac, CPU_STARVED_WARN_FRAC, CPU_STARVED_CRITICAL_FRAC)
    if severity is None or median_frac is None:
        return None
    threshold = CPU_STARVED_CRITICAL_FRAC if severity == "critical" else CPU_STARVED_WARN_FRAC
    return Finding(
        cause="allocation",
        severity=severity,
        title=contention_title(load, ranks, median_frac),
        suggestion=contention_suggestion(load),
        evidence=tuple(contention_evidence(load, ranks, median_frac, threshold)),
        ranks=tuple(sorted(r.rank for r in ranks)),
        run_id=run_id,
        magnitude=median_frac,
        # The training thread's own wait for a CPU is step time lost outright.
        cost_s=median(
            [
                (r.stats.cpu.main_wait_frac or 0.0) * (r.stats.step.mean_s or 0.0)
                for r in ranks
                if r.stats.cpu.main_wait_frac is not None
            ]
        ),
        step_s=mean_step_s(ranks),
        hostname=hostname,
        details=AllocationDetails(cpu_contention=True),
    )


def cpu_explains(finding: Finding, ranks: Sequence[RankFigures], everyone: Sequence[RankFigures] = ()) -> bool:
    """Whether CPU starvation explains a symptom finding on these (starved) ranks; ``everyone``: the run's ranks."""
    if is_rotation(finding):
        # Names no rank: CPU taken by others slows whichever starved rank it lands on, a different one each time.
        return len(ranks) >= 2
    mine = [r for r in ranks if r.rank in finding.ranks]
    if not mine:
        return False
    if finding.cause == "communication":
        return all(not r.on_cuda for r in mine)  # gloo on the CPU: the all-reduce itself needs a core
    if finding.cause == "data_loading":  # starved workers; a sleeping or I/O-bound loader is not explained
        return all((r.stats.cpu.workers_starved_frac or 0.0) > CPU_STARVED_WARN_FRAC for r in mine)
    if finding.cause == "straggler":
        phase = finding.details.phase if isinstance(finding.details, StragglerDetails) else None
        if phase == "loader":
            return all((r.stats.cpu.workers_starved_frac or 0.0) > CPU_STARVED_WARN_FRAC for r in mine)
        if phase not in ("forward", "backward", "own"):
            return False  # time outside the model's phases is extra work (a metric, a save), not a slower CPU
        # A CPU rank computing slower because it is the one squeezed: it waits for a CPU more than the others.
        # "own", an excess spread over its phases with none holding most of it, is what a slower CPU does too.
        others = median([r.stats.cpu.starved_frac or 0.0 for r in everyone or ranks if r.rank not in finding.ranks])
        return all(not r.on_cuda and (r.stats.cpu.starved_frac or 0.0) > (others or 0.0) for r in mine)
    return False


def has_cpu_contention(finding: Finding) -> bool:
    """An allocation finding that measured its ranks waiting for a CPU (``contention_finding``)."""
    return isinstance(finding.details, AllocationDetails) and finding.details.cpu_contention


def contention_explains(contention: Finding, finding: Finding, machine: Figures) -> bool:
    """A symptom of the run's CPU contention: its ranks' exchange, loader wait or slow compute (``cpu_explains``).

    Compressing gradients or adding workers would not help: the fix that helps
    is the allocation finding's.
    """
    run = next((r for r in machine.runs if r.run_id == contention.run_id), None)
    if run is None:
        return False
    ranks = [r for r in run.ranks if r.rank in contention.ranks]
    return (
        finding.run_id == contention.run_id and finding.severity != "info" and cpu_explains(finding, ranks, run.ranks)
    )
