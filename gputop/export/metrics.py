"""gputop's figures and findings as Prometheus metric families: pure, no client library.

``families(figures, findings, ...)`` turns one refresh's ``Figures`` (the same
numbers the dashboard and the report show) and the live findings into plain
frozen families; ``gputop.export.prometheus`` hands them to prometheus-client.
Every metric is declared once in ``METRICS`` with its help text, and
docs/prometheus.md documents each one (a test checks).

Conventions: base units in names (``_seconds``, ``_bytes``, ``_ratio`` for 0..1),
counters end in ``_total`` (prometheus-client appends it), label names those of
NVIDIA's DCGM exporter where the thing is the same (``UUID``, ``gpu``,
``modelName``, ``Hostname``, ``pod``, ``namespace``) so a Grafana panel joins
``gputop_*`` with ``DCGM_FI_*`` on ``UUID``.  Cardinality is bounded: ranks are
those the store keeps (at most ``MAX_RUNS`` runs), capped at ``MAX_RANK_SERIES``;
a finding is one series whatever the number of ranks it names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gputop.combine import phase_seconds
from gputop.diagnose.findings import Finding
from gputop.diagnose.rules.hang import step_clock
from gputop.diagnose.thresholds import HANG_LONGEST_FACTOR, HANG_MIN_S, HANG_STEP_FACTOR
from gputop.diagnose.waste import idle_gpus
from gputop.model.figures import Figures, RankFigures
from gputop.model.frames import span_frames
from gputop.model.snapshot import DONE, LIVE, LOST

Kind = Literal["gauge", "counter"]
MAX_RANK_SERIES = 4096  # ranks exported per scrape; a 1,024-rank job is ~35k series in all

RANK_LABELS = ("run", "rank", "Hostname", "UUID", "pod", "namespace", "slurm_job")
GPU_LABELS = ("gpu", "UUID", "modelName", "Hostname")
FINDING_LABELS = ("cause", "severity", "run", "Hostname", "rank", "gpu")


@dataclass(frozen=True)
class Spec:
    name: str  # without _total for counters: the client library appends it
    kind: Kind
    help: str
    labels: tuple[str, ...]


@dataclass(frozen=True)
class Family:
    spec: Spec
    samples: tuple[tuple[tuple[str, ...], float], ...]  # label values in spec order, value


def _rank(name: str, help_text: str, kind: Kind = "gauge", extra: tuple[str, ...] = ()) -> Spec:
    return Spec(name, kind, help_text, RANK_LABELS + extra)


def _gpu(name: str, help_text: str, extra: tuple[str, ...] = ()) -> Spec:
    return Spec(name, "gauge", help_text, GPU_LABELS + extra)


SPAN = "over the last 10 s of windows"
METRICS: tuple[Spec, ...] = (
    _rank("gputop_rank_up", "1 while the rank reports (or finished cleanly), 0 once it is lost"),
    _rank(
        "gputop_rank_ended",
        "1 once the rank said bye, labelled with how it ended: exit (finished), signal (SIGTERM, SIGINT), "
        "exception (failed)",
        extra=("how",),
    ),
    _rank("gputop_steps", "Optimizer steps the rank has taken", "counter"),
    _rank("gputop_step_time_seconds", f"Wall time per training step, quantile {SPAN}", extra=("quantile",)),
    _rank("gputop_step_time_mean_seconds", f"Mean wall time per training step {SPAN}"),
    _rank("gputop_gpu_step_time_seconds", f"Median GPU time per step from CUDA events {SPAN}"),
    _rank("gputop_steps_per_second", f"Steps per second {SPAN}"),
    _rank("gputop_samples_per_second", f"Samples per second (steps x DataLoader batch size) {SPAN}"),
    _rank("gputop_loader_wait_ratio", f"Share of step time blocked waiting for the next batch {SPAN}"),
    _rank("gputop_exposed_comm_ratio", f"Share of step time in gradient exchange not hidden by backward {SPAN}"),
    _rank("gputop_phase_seconds", f"Seconds per step in each phase {SPAN}", extra=("phase",)),
    _rank("gputop_phase_ratio", f"Share of step time in each phase {SPAN}", extra=("phase",)),
    _rank(
        "gputop_collective_seconds",
        f"Seconds per step in each kind of collective on each process group, in flight or exposed (the training "
        f"thread blocked on it) {SPAN}",
        extra=("kind", "group", "part"),
    ),
    _rank(
        "gputop_collective_calls",
        f"Collectives per step of each kind on each process group {SPAN}",
        extra=("kind", "group"),
    ),
    _rank(
        "gputop_collective_bytes",
        f"Bytes per step the rank sent in each kind of collective on each group {SPAN}",
        extra=("kind", "group"),
    ),
    _rank(
        "gputop_collective_bus_bandwidth_bytes_per_second",
        f"Bus bandwidth of one collective of each kind on each group, from its time in flight, by nccl-tests' "
        f"formulas (comparable with the link's own speed whatever the kind and group size) {SPAN}",
        extra=("kind", "group"),
    ),
    _rank(
        "gputop_collective_number",
        "torch's count of the collectives the rank has issued on each process group, the same on every rank for "
        "the same collective; exported while the rank has gone 3 s without a step (a rank behind the others' "
        "number never issued the collective they wait in)",
        extra=("group",),
    ),
    _rank("gputop_flops_per_step", f"The model's FLOPs a training step, forward and backward, counted {SPAN}"),
    _rank("gputop_achieved_flops_per_second", f"FLOP/s the rank's steps achieved on the model's work {SPAN}"),
    _rank(
        "gputop_mfu_ratio",
        f"Model FLOPs utilization: achieved FLOP/s over the device's dense peak for the step's dtypes {SPAN} (beside "
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, joined on UUID)",
    ),
    _rank("gputop_memory_allocated_bytes", "CUDA memory allocated by tensors (torch.cuda.memory_stats)"),
    _rank("gputop_memory_reserved_bytes", "CUDA memory reserved by PyTorch's caching allocator"),
    _rank("gputop_memory_peak_bytes", "Peak CUDA memory allocated"),
    _rank("gputop_memory_alloc_retries", "cudaMalloc retries after freeing the cache (memory pressure)", "counter"),
    _rank("gputop_process_cpu_ratio", f"The rank process's CPU, 1 = one core busy {SPAN}"),
    _rank("gputop_process_resident_memory_bytes", "The rank process's resident memory"),
    _rank("gputop_dataloader_workers", "DataLoader worker processes of the rank"),
    _rank("gputop_dataloader_workers_cpu_ratio", f"The rank's DataLoader workers' CPU, 1 = one core {SPAN}"),
    _rank("gputop_reporter_cpu_ratio", f"gputop's own reporter thread's CPU in the rank, 1 = one core {SPAN}"),
    _rank("gputop_windows_dropped", "Windows the rank dropped because its backlog was full", "counter"),
    _rank("gputop_seconds_since_step", "Seconds since the rank's last step ended, while it reports (the hang clock)"),
    _rank(
        "gputop_hang_line_seconds",
        f"Seconds without a step that read as hung for the rank: {HANG_STEP_FACTOR:g} usual steps, "
        f"{HANG_LONGEST_FACTOR:g}x the longest lately, {HANG_MIN_S:g} s at least (the hang rule's line)",
    ),
    _rank(
        "gputop_rank_top_frame_ratio",
        f"Share of the training thread's stack samples at its most sampled place {SPAN}",
        extra=("where", "function", "file", "line"),
    ),
    _gpu("gputop_gpu_utilization_ratio", "NVML GPU utilization (share of time a kernel ran)"),
    _gpu("gputop_gpu_memory_used_bytes", "NVML memory used on the GPU, every process"),
    _gpu("gputop_gpu_memory_total_bytes", "NVML memory on the GPU"),
    _gpu("gputop_gpu_power_watts", "NVML power draw"),
    _gpu("gputop_gpu_temperature_celsius", "NVML GPU temperature"),
    _gpu("gputop_gpu_foreign_processes", "Processes on the GPU that are no reporting rank nor its child"),
    _gpu("gputop_gpu_rank_info", "1 for each rank on the GPU, joined by device UUID", extra=("run", "rank")),
    Spec(
        "gputop_finding",
        "gauge",
        "1 for each diagnosis at work; rank is empty when it names several, Hostname when they span hosts",
        FINDING_LABELS,
    ),
    Spec(
        "gputop_finding_waste_per_hour",
        "gauge",
        "Device-hours an hour a finding's cause idles (unit GPU, or core on a CPU run): the run's devices x the "
        "step share fixing it would recover",
        (*FINDING_LABELS, "unit"),
    ),
    Spec(
        "gputop_run_idle_gpu_hours_per_hour",
        "gauge",
        "GPU-hours a run's GPUs sit idle every hour: each of its GPUs' idle share over the span, summed",
        ("run_id",),
    ),
    Spec("gputop_collector_ranks", "gauge", "Ranks the collector knows, by status (live, lost, done)", ("status",)),
    Spec("gputop_collector_hosts", "gauge", "Hosts with at least one reporting rank", ()),
    Spec("gputop_token_refusals", "counter", "Connections refused for a wrong or missing GPUTOP_TOKEN", ()),
    Spec(
        "gputop_exporter_rank_series_omitted", "gauge", f"Ranks left out past {MAX_RANK_SERIES} (cardinality cap)", ()
    ),
)


def _rank_labels(r: RankFigures) -> tuple[str, ...]:
    hello = r.hello
    return (
        r.run_id, str(r.rank), hello.hostname, hello.device_uuid or "", hello.k8s_pod or "", hello.k8s_namespace or "",
        hello.slurm_job_id or "",
    )  # fmt: skip


def _rank_values(r: RankFigures) -> dict[str, list[tuple[tuple[str, ...], float | None]]]:
    """Each rank metric's samples for one rank: extra label values and the value (None: not measured)."""
    s = r.stats
    last = r.snapshot.windows[-1] if r.snapshot.windows else None
    phases = phase_seconds(s.phases)
    step = s.step.mean_s

    def ratio(pct: float | None) -> float | None:
        return None if pct is None else pct / 100

    return {
        "gputop_rank_up": [((), 0.0 if r.status == LOST else 1.0)],
        "gputop_rank_ended": [((r.snapshot.ended_how,), 1.0)] if r.status == DONE else [],
        "gputop_steps": [((), float(last.step_total) if last is not None and last.step_total is not None else None)],
        "gputop_step_time_seconds": [(("0.5",), s.step.p50_s), (("0.95",), s.step.p95_s)],
        "gputop_step_time_mean_seconds": [((), step)],
        "gputop_gpu_step_time_seconds": [((), s.step.gpu_p50_s)],
        "gputop_steps_per_second": [((), s.step.per_s)],
        "gputop_samples_per_second": [((), s.step.samples_per_s)],
        "gputop_loader_wait_ratio": [((), s.phases.loader_wait_frac)],
        "gputop_exposed_comm_ratio": [((), s.phases.exposed_comm_frac)],
        # The phases the rank measures (gputop.combine.PHASES; an optimizer no hook times has no series).
        "gputop_phase_seconds": [((p,), seconds) for p, seconds in phases.items()],
        "gputop_phase_ratio": [
            ((p,), None if seconds is None or not step else seconds / step) for p, seconds in phases.items()
        ],
        # At most COLLECTIVES_KEPT kinds x groups a rank, each with bounded label values (gputop.protocol).
        "gputop_collective_seconds": [
            ((c.kind, c.group, part), value)
            for c in s.collectives
            for part, value in (("in_flight", c.busy_s), ("exposed", c.exposed_s))
        ],
        "gputop_collective_calls": [((c.kind, c.group), c.calls) for c in s.collectives],
        "gputop_collective_bytes": [((c.kind, c.group), c.bytes) for c in s.collectives],
        "gputop_collective_bus_bandwidth_bytes_per_second": [
            ((c.kind, c.group), None if c.bandwidth is None else c.bandwidth[1]) for c in s.collectives
        ],
        "gputop_flops_per_step": [((), s.work.flops_per_step)],
        "gputop_achieved_flops_per_second": [((), s.work.achieved_flops_per_s)],
        "gputop_mfu_ratio": [((), r.mfu)],
        "gputop_memory_allocated_bytes": [((), s.memory.allocated_bytes)],
        "gputop_memory_reserved_bytes": [((), s.memory.reserved_bytes)],
        "gputop_memory_peak_bytes": [((), s.memory.peak_bytes)],
        "gputop_memory_alloc_retries": [((), s.memory.alloc_retries)],
        "gputop_process_cpu_ratio": [((), ratio(s.cpu.pct))],
        "gputop_process_resident_memory_bytes": [((), s.cpu.rss_bytes)],
        "gputop_dataloader_workers": [((), s.cpu.workers)],
        "gputop_dataloader_workers_cpu_ratio": [((), ratio(s.cpu.workers_pct))],
        "gputop_reporter_cpu_ratio": [((), ratio(s.cost.reporter_cpu_pct))],
        "gputop_windows_dropped": [((), float(s.dropped))],
        "gputop_rank_top_frame_ratio": top_frame(r),
        "gputop_collective_number": collective_numbers(r),
    }


def collective_numbers(r: RankFigures) -> list[tuple[tuple[str, ...], float | None]]:
    """Each group's collective number, from the rank's newest stack message (it numbers them while stuck)."""
    frames = r.frames
    if frames is None or not frames.groups:
        return []
    return [((g.group,), float(g.seq)) for g in frames.groups if g.seq is not None]


def top_frame(r: RankFigures) -> list[tuple[tuple[str, ...], float | None]]:
    """The rank's most sampled place over the span: one series a rank, not one per place it was seen in."""
    frames = span_frames(r)
    if frames is None or not frames.top:
        return []
    top = frames.top[0]
    return [((top.frame.where, top.frame.function, top.frame.file, str(top.frame.line)), top.share)]


def families(figures: Figures, findings: Sequence[Finding], *, gpu_hostname: str) -> list[Family]:
    """Every metric of ``METRICS`` for one refresh; a value not measured is left out, never made up.

    ``gpu_hostname`` is the ``Hostname`` of the exporter's own machine's GPUs; another
    host's GPUs (from its node sampler) carry that host's name.
    """
    out: dict[str, list[tuple[tuple[str, ...], float]]] = {spec.name: [] for spec in METRICS}
    ranks = figures.all_ranks()
    host_of = {(r.run_id, r.rank): r.hello.hostname for r in ranks}
    for r in ranks[:MAX_RANK_SERIES]:
        labels = _rank_labels(r)
        for name, samples in _rank_values(r).items():
            out[name] += [(labels + extra, float(v)) for extra, v in samples if v is not None]
        # The hang clock of a rank that reports: a finished or lost one has none, so no rule calls it hung.
        if r.status == LIVE and (clock := step_clock(r)) is not None:
            out["gputop_seconds_since_step"].append((labels, max(figures.snapshot.t - clock.last_step_t, 0.0)))
            out["gputop_hang_line_seconds"].append((labels, clock.line_s))
    for a in figures.assignments:
        g = a.gpu
        labels = (str(g.index), g.uuid, g.name, a.hostname or gpu_hostname)  # a node's GPUs: its host
        for name, value in (
            ("gputop_gpu_utilization_ratio", None if g.util_pct is None else g.util_pct / 100),
            ("gputop_gpu_memory_used_bytes", g.mem_used_bytes),
            ("gputop_gpu_memory_total_bytes", g.mem_total_bytes),
            ("gputop_gpu_power_watts", g.power_w),
            ("gputop_gpu_temperature_celsius", g.temp_c),
            ("gputop_gpu_foreign_processes", len(a.unobserved)),
        ):
            if value is not None:
                out[name].append((labels, float(value)))
        out["gputop_gpu_rank_info"] += [((*labels, v.run_id, str(v.rank)), 1.0) for v in a.ranks]
    finding_series: dict[tuple[str, ...], float] = {}  # two findings alike in every label are one series
    waste_series: dict[tuple[str, ...], float] = {}
    for f in findings:
        hosts = {host_of.get((f.run_id or "", rank), "") for rank in f.ranks}
        host = f.hostname or (hosts.pop() if len(hosts) == 1 else "")
        rank = str(f.ranks[0]) if len(f.ranks) == 1 else ""
        gpu = str(f.gpus[0]) if len(f.gpus) == 1 else ""
        finding_series[(f.cause, f.severity, f.run_id or "", str(host), rank, gpu)] = 1.0
        if f.waste is not None:
            labels = (f.cause, f.severity, f.run_id or "", str(host), rank, gpu, f.waste.unit)
            waste_series[labels] = waste_series.get(labels, 0.0) + f.waste.per_hour
    out["gputop_finding"] = list(finding_series.items())
    out["gputop_finding_waste_per_hour"] = list(waste_series.items())
    for run in figures.runs:
        if (idle := idle_gpus([run], figures.gpu_util_pct)) is not None:
            out["gputop_run_idle_gpu_hours_per_hour"].append(((run.run_id,), idle[0]))
    statuses = [r.status for r in ranks]
    out["gputop_collector_ranks"] = [((status,), float(statuses.count(status))) for status in sorted(set(statuses))]
    out["gputop_collector_hosts"] = [((), float(len({r.hello.hostname for r in ranks if r.status != LOST})))]
    out["gputop_token_refusals"] = [((), float(figures.snapshot.token_refusals))]
    out["gputop_exporter_rank_series_omitted"] = [((), float(max(len(ranks) - MAX_RANK_SERIES, 0)))]
    return [Family(spec, tuple(out[spec.name])) for spec in METRICS]
