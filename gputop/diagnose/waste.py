"""What a finding costs in the units a team pays in: GPU-hours (core-hours on a CPU run), and money at a price.

A finding's "fixing it: about 58 ms a step" is a share of every step; the run
holds its devices for every step, so that share of them sits idle for the
cause: ``devices x cost / step`` device-hours every hour the run goes on, and
that rate times the hours so far.  One definition, carried on the finding
(``Finding.waste``, a ``Waste``), so the dashboard, the report, the alerts and the exporter
all say the same number; only the price, a user's setting, is applied where
it is shown.

Devices: a CUDA run's GPUs (each rank's device, every GPU of an
``nn.DataParallel`` rank); a CPU run's cores, as many as its ranks and
their workers keep busy on average.  An estimate, like the cost it scales:
the rest of the step is assumed unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gputop.diagnose.findings import Finding, Unit, Waste
from gputop.model.figures import Figures, RunFigures, mean_gpu_util_pct
from gputop.model.join import normalize_uuid


@dataclass(frozen=True)
class Held:
    """What a run holds while it runs, and for how long so far."""

    unit: Unit
    devices: float
    hours: float


def held(run: RunFigures) -> Held | None:
    """The run's GPUs (or busy cores) and its hours so far; None when neither is known."""
    ranks = [r for r in run.ranks if r.windows]
    if not ranks:
        return None
    start = run.snapshot.first_seen_t
    end = max(r.windows[-1].t1 for r in ranks)  # live, the newest window: now, near enough
    hours = max(end - start, 0.0) / 3600.0
    gpus: set[str] = set()
    for r in ranks:
        if r.on_cuda:  # a CUDA rank whose device is not named holds one GPU of its own
            unnamed = (f"{r.hello.hostname}:{r.rank}",)
            gpus.update(r.hello.device_uuids or ((r.hello.device_uuid,) if r.hello.device_uuid else unnamed))
    if gpus:
        return Held("GPU", float(len(gpus)), hours)
    busy = [(r.stats.cpu.pct or 0.0) + (r.stats.cpu.workers_pct or 0.0) for r in ranks if r.stats.cpu.pct is not None]
    if not busy:
        return None
    return Held("core", sum(busy) / 100.0, hours)


def idle_gpus(runs: Sequence[RunFigures], gpu_util_pct: dict[str, float]) -> tuple[float, int] | None:
    """(GPU-hours the runs' GPUs sit idle every hour, how many GPUs): each GPU's idle share, summed once.

    A GPU is a run's when a rank with windows in the figures names it as its device (an
    ``nn.DataParallel`` rank names all of its); GPUs two runs share count once.
    ``gpu_util_pct``: each GPU's mean utilization by UUID over the runs' own time (the live
    span's ``Figures.gpu_util_pct``; ``run_gpu_util_pct`` for a whole recording). None when no
    GPU of the runs has a reading: a CPU run, or no NVML; a CPU run's busy cores are priced per
    finding, not as idle time.
    """
    uuids = set().union(*(run_gpus(run) for run in runs))
    by_uuid = {normalize_uuid(u): util for u, util in gpu_util_pct.items()}
    utils = [by_uuid[u] for u in uuids if u in by_uuid]
    if not utils:
        return None
    return sum(max(1.0 - util / 100.0, 0.0) for util in utils), len(utils)


def run_gpus(run: RunFigures) -> set[str]:
    """The run's GPUs, normalized UUIDs: those its ranks with windows name as their devices."""
    return {
        normalize_uuid(u) for r in run.ranks if r.windows for u in (r.hello.device_uuids or (r.hello.device_uuid,)) if u
    }


def run_span(run: RunFigures) -> tuple[float, float] | None:
    """The run's own time in the figures: its ranks' first window's start to their last window's end."""
    spans = [(r.windows[0].t0, r.windows[-1].t1) for r in run.ranks if r.windows]
    return (min(t0 for t0, _ in spans), max(t1 for _, t1 in spans)) if spans else None


def run_gpu_util_pct(figures: Figures, run: RunFigures) -> dict[str, float]:
    """Each GPU's mean utilization over the run's own time (its ranks' first to last window), not the recording's."""
    span = run_span(run)
    if span is None:
        return {}
    since, until = span
    return mean_gpu_util_pct(figures.snapshot.gpu_samples(), since_t=since, until_t=until)


def run_gpu_power_w(figures: Figures, run: RunFigures) -> float | None:
    """What the run's GPUs draw together, watts: each GPU's mean NVML power reading over the run's windows."""
    uuids, span = run_gpus(run), run_span(run)
    if not uuids or span is None:
        return None
    since, until = span
    readings: dict[str, list[float]] = {}
    for sample in figures.snapshot.gpu_samples():
        if since <= sample.t <= until:
            for gpu in sample.gpus:
                if gpu.power_w is not None and (uuid := normalize_uuid(gpu.uuid)) in uuids:
                    readings.setdefault(uuid, []).append(gpu.power_w)
    return sum(sum(w) / len(w) for w in readings.values()) if readings else None


def with_waste(findings: list[Finding], machine: Figures) -> list[Finding]:
    """Each finding with a cost estimate, with what it idles of its run's devices."""
    runs = {run.run_id: run for run in machine.runs}
    holding = {run_id: held(run) for run_id, run in runs.items()}
    out = []
    for f in findings:
        what = holding.get(f.run_id or "")
        if what is None or f.cost_s is None or not f.step_s or f.severity == "info":
            out.append(f)
            continue
        share = min(f.cost_s / f.step_s, 1.0)
        per_hour = what.devices * share
        watts = run_gpu_power_w(machine, runs[f.run_id or ""]) if what.unit == "GPU" else None
        kwh = None if watts is None else watts * share / 1000.0
        waste = Waste(what.unit, what.devices, per_hour, per_hour * what.hours)
        if kwh is not None:
            waste = replace(waste, kwh_per_hour=kwh, kwh_so_far=kwh * what.hours)
        out.append(replace(f, waste=waste))
    return out
