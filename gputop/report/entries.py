"""The report's data: a run's figures and findings as plain, JSON-ready entries (``--format json``).

The rank figures are the model's, the same the dashboard shows and the findings quote.  No I/O here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

from gputop.combine import OWN_PHASES
from gputop.diagnose import Finding
from gputop.diagnose.thresholds import MIN_STEPS
from gputop.diagnose.waste import idle_gpus, run_gpu_util_pct
from gputop.model.figures import Figures, GputopCost, RankFigures
from gputop.model.frames import span_frames
from gputop.model.jobs import job_ids, job_text
from gputop.model.snapshot import LOST
from gputop.model.work import work_entry


def to_ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else round(fraction * 100.0, 2)


def _pct3(fraction: float | None) -> float | None:
    """Shares too small for two decimals of a percent (gputop's own cost)."""
    return None if fraction is None else round(fraction * 100.0, 3)


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def rank_entry(figures: RankFigures) -> dict[str, Any]:
    """One rank's row: its figures in the report's units (ms, %), None for N/A.

    ``frames``: where its training thread was (the places most stack samples
    found it, and the newest sample's), None when its reporter sent no samples.
    """
    stats, view = figures.stats, figures.snapshot
    frames = span_frames(figures)
    return {
        "rank": figures.rank,
        "steps": stats.steps,
        "step_time_p50_ms": to_ms(stats.step.p50_s),
        "step_time_p95_ms": to_ms(stats.step.p95_s),
        "step_time_max_ms": to_ms(stats.step.max_s),
        "gpu_step_time_p50_ms": to_ms(stats.step.gpu_p50_s),
        "samples_per_s": _round(stats.step.samples_per_s, 1),
        "loader_wait_pct": _pct(stats.phases.loader_wait_frac),
        "micro_batches_per_step": _round(stats.phases.micro_batches, 2),
        # Each phase of the rank's own work (gputop.combine.PHASES) but the loader's, as "<phase>_ms".
        **{f"{p.name}_ms": to_ms(getattr(stats.phases, p.seconds)) for p in OWN_PHASES if p.name != "loader"},
        "comm_ms": to_ms(stats.phases.comm_s),
        "comm_exposed_ms": to_ms(stats.phases.exposed_comm_s),
        "comm_exposed_pct": _pct(stats.phases.exposed_comm_frac),
        "phases_from": stats.phases.source,
        "collectives": [c.to_dict() for c in stats.collectives],
        **work_entry(figures),
        "mem_peak_bytes": stats.memory.peak_bytes,
        "alloc_retries": stats.memory.alloc_retries,
        "ooms": stats.memory.ooms,
        "cpu_pct": _round(stats.cpu.pct, 1),
        "rss_bytes": stats.cpu.rss_bytes,
        "workers": stats.cpu.workers,
        "workers_cpu_pct": _round(stats.cpu.workers_pct, 1),
        "threads": stats.cpu.threads,
        "cpu_wait_main_pct": _pct(stats.cpu.main_wait_frac),
        "cpu_demand_cores": _round(stats.cpu.demand_cores, 2),
        "stall_steps": stats.stalls.steps,
        "stall_mean_ms": to_ms(stats.stalls.mean_s),
        "stall_pct": _pct(stats.stalls.frac),
        "cpu_starved_pct": _pct(stats.cpu.starved_frac),
        "workers_cpu_starved_pct": _pct(stats.cpu.workers_starved_frac),
        "dropped_windows": stats.dropped,
        "gputop_reporter_cpu_pct": _round(stats.cost.reporter_cpu_pct, 3),
        "gputop_hook_us_per_step": _round(None if (hook := stats.cost.hook_s_per_step) is None else hook * 1e6, 2),
        "gputop_cpu_share_pct": _pct3(stats.cost.cpu_frac),
        "gputop_sent_bytes_per_s": _round(stats.cost.sent_bytes_per_s, 0),
        "host": view.hello.hostname,
        "pid": view.hello.pid,
        "device": view.hello.device,
        "device_uuid": view.hello.device_uuid,
        "status": view.status,
        "status_reason": view.status_reason,
        "lost": view.status == LOST,
        "frames": None if frames is None else frames.to_dict(),
        "frames_text": None if frames is None else frames.text(),
    }


def build(
    figures: Figures,
    findings: Sequence[Finding] = (),
    *,
    gpus: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
    price_per_hour: float | None = None,
) -> dict[str, Any]:
    """The report as plain data, from the figures of the span the caller chose (usually the whole run)."""
    runs = []
    for run in figures.runs:
        windows = [r.windows for r in run.ranks if r.windows]
        t0 = min((w[0].t0 for w in windows), default=None)
        t1 = max((w[-1].t1 for w in windows), default=None)
        runs.append(
            {
                "run_id": run.run_id,
                "name": run.snapshot.name,
                "world_size": run.world_size,
                "duration_s": None if t0 is None or t1 is None else round(t1 - t0, 2),
                "ranks": [rank_entry(r) for r in run.ranks],
                "gputop_cost": cost_entry(run.gputop_cost),
                "idle_gpus": idle_entry(idle_gpus([run], run_gpu_util_pct(figures, run)), price_per_hour),
                "job": job_ids(run.snapshot.ranks[0].hello) if run.snapshot.ranks else {},
                "job_text": job_text(run.snapshot.ranks[0].hello) if run.snapshot.ranks else "",
            }
        )
    return {
        "runs": runs,
        "findings": [f.to_dict(price_per_hour) for f in findings],
        "gpus": gpus if gpus is not None else {},
        "notes": list(notes),
        "gputop_process_cpu_pct": _round(figures.dashboard_cpu_pct, 2),
    }


class _IdleEntry(TypedDict):
    gpu_hours_per_hour: float
    gpus: int


class IdleEntry(_IdleEntry, total=False):
    """A run's ``idle_gpus`` in the report."""

    money_per_hour: float  # only at a price


class CostEntry(TypedDict):
    """A run's ``gputop_cost`` in the report; None: not accounted for."""

    cpu_share_pct: float | None
    reporter_cpu_pct_per_rank: float | None
    hook_us_per_step: float | None
    sent_bytes_per_s: float | None


def idle_entry(idle: tuple[float, int] | None, price_per_hour: float | None) -> IdleEntry | None:
    """The run's idle GPU-hours every hour (``gputop.diagnose.waste.idle_gpus``), in money at a price."""
    if idle is None:
        return None
    hours, gpus = idle
    out: IdleEntry = {"gpu_hours_per_hour": round(hours, 3), "gpus": gpus}
    if price_per_hour is not None:
        out["money_per_hour"] = round(hours * price_per_hour, 2)
    return out


def cost_entry(cost: GputopCost) -> CostEntry:
    """What gputop cost a run, in the report's units."""
    hook = cost.hook_s_per_step
    return {
        "cpu_share_pct": _pct3(cost.cpu_frac),
        "reporter_cpu_pct_per_rank": _round(cost.reporter_cpu_pct, 3),
        "hook_us_per_step": _round(None if hook is None else hook * 1e6, 2),
        "sent_bytes_per_s": _round(cost.sent_bytes_per_s, 0),
    }


def undecided_notes(figures: Figures) -> list[str]:
    """Ranks whose run was too short to judge: the rules stay silent on them, and the report says so."""
    notes = []
    for run in figures.runs:
        short = [r for r in run.ranks if r.stats.steps < MIN_STEPS or r.stats.step.mean_s is None]
        if short:
            made = ", ".join(f"rank {r.rank}: {r.stats.steps}" for r in short)
            notes.append(
                f"run {run.run_id} too short to decide: steps made ({made}) are fewer than the {MIN_STEPS} "
                "timed steps a share of step time needs"
            )
    return notes
