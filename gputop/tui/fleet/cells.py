"""How ``gputop fleet``'s tables read: one row of cells per run, slow rank, alert, node rank, GPU and finding.

Pure functions from ``gputop.fleet``'s dataclasses to Rich ``Text`` cells (never
markup strings: a run's name is the user's and may hold brackets), in the
dashboard's units (``gputop.tui.format``) and the theme's colours (``Palette``).
A figure Prometheus or the exporter did not have is N/A, dimmed, never zero.
"""

from __future__ import annotations

from rich.text import Text

from gputop.diagnose.thresholds import (
    EXPOSED_COMM_CRITICAL_FRAC,
    EXPOSED_COMM_WARN_FRAC,
    LOADER_WAIT_CRITICAL_FRAC,
    LOADER_WAIT_WARN_FRAC,
    STRAGGLER_WAIT_CRITICAL_FRAC,
    STRAGGLER_WAIT_WARN_FRAC,
)
from gputop.fleet.node import NodeFinding, NodeGpu, NodeRank
from gputop.fleet.query import CollectiveWait, FiringAlert, FleetRun, SlowRank
from gputop.tui.format import NA, fmt_bytes, fmt_frac, fmt_mfu, fmt_rate, fmt_s
from gputop.tui.palette import Palette

RUN_COLUMNS = ("run", "ranks", "step p50", "steps/s", "loader", "comm", "MFU", "idle GPU-h/h", "worst alert")
SLOW_COLUMNS = ("rank", "Hostname", "instance", "others wait", "last to arrive in")
ALERT_COLUMNS = ("state", "severity", "cause", "rank on host", "alert")
NODE_RANK_COLUMNS = ("run", "rank", "Hostname", "step", "steps/s", "loader", "comm", "since step", "status")
NODE_GPU_COLUMNS = ("Hostname", "GPU", "model", "util", "memory", "power", "temp", "ranks")


def _cell(text: str, style: str = "") -> Text:
    """A cell: plain text, never markup; N/A is dimmed."""
    return Text(text, style="dim" if text == NA else style)


def _loader(frac: float | None, palette: Palette) -> Text:
    return _cell(fmt_frac(frac), palette.level(frac, LOADER_WAIT_WARN_FRAC, LOADER_WAIT_CRITICAL_FRAC))


def _comm(frac: float | None, palette: Palette) -> Text:
    return _cell(fmt_frac(frac), palette.level(frac, EXPOSED_COMM_WARN_FRAC, EXPOSED_COMM_CRITICAL_FRAC))


def score_text(score: float) -> str:
    """A straggler score as the share of each step the others wait for the rank: "+54%"."""
    return f"{score:+.0%}"


def alert_style(alert: FiringAlert, palette: Palette) -> str:
    """Firing critical in the error colour, firing warning in the warning colour, pending dimmed."""
    if alert.state != "firing":
        return palette.muted
    return palette.bad if alert.severity == "critical" else palette.warn


def run_cells(run: FleetRun, palette: Palette) -> list[Text]:
    """One run's row: its name, its ranks (with those ended: lost in red, failed in the warning colour), figures
    and its worst alert."""
    worst = run.alerts[0] if run.alerts else None  # read_fleet sorts them: firing, then critical, first
    idle = NA if run.idle_gpu_hours_per_hour is None else f"{run.idle_gpu_hours_per_hour:.1f}"
    return [
        _cell(run.run, "bold"),
        _ranks(run, palette),
        _cell(fmt_s(run.step_s)),
        _cell(fmt_rate(run.steps_per_s)),
        _loader(run.loader_wait, palette),
        _comm(run.exposed_comm, palette),
        _cell(fmt_mfu(run.mfu)),
        _cell(idle),
        _cell(f"{worst.state} {worst.severity} {worst.cause}", alert_style(worst, palette))
        if worst is not None
        else _cell("none", palette.muted),
    ]


def _ranks(run: FleetRun, palette: Palette) -> Text:
    """ "8 (2 finished, 1 failed, 1 lost)": the ranks no longer live beside the count, coloured by the worst."""
    no_longer_live = run.ended_text()
    if not no_longer_live:
        return _cell(str(run.ranks))
    style = palette.bad if run.lost else palette.warn if run.failed else ""
    return _cell(f"{run.ranks} ({no_longer_live})", style)


def slow_cells(slow: SlowRank, palette: Palette, last_in: CollectiveWait | None = None) -> list[Text]:
    """One of a run's slowest ranks: where it runs, how long the others wait for it each step, and the collective
    it reaches last where they wait the longest (N/A: last in none, or no collective timed)."""
    style = palette.level(slow.score, STRAGGLER_WAIT_WARN_FRAC, STRAGGLER_WAIT_CRITICAL_FRAC)
    where = NA if last_in is None else f"{last_in.kind} on {last_in.group} (+{last_in.wait_s * 1e3:.1f} ms)"
    return [
        _cell(slow.rank, "bold"),
        _cell(slow.hostname or NA),
        _cell(slow.instance or NA),
        _cell(score_text(slow.score), style),
        _cell(where),
    ]


def alert_cells(alert: FiringAlert, palette: Palette) -> list[Text]:
    """One alert at work on a run."""
    style = alert_style(alert, palette)
    where = f"{alert.rank} on {alert.hostname or '?'}" if alert.rank else "the run"
    return [_cell(alert.state, style), _cell(alert.severity, style), _cell(alert.cause), _cell(where),
            _cell(alert.name)]  # fmt: skip


def node_rank_cells(rank: NodeRank, palette: Palette) -> list[Text]:
    """One rank of a node, from its exporter's page."""
    if rank.up is None:
        status = _cell(NA)
    elif rank.up == 0:
        status = _cell("lost", palette.bad)
    elif rank.seconds_since_step is None:
        status = _cell("done", palette.muted)
    else:
        status = _cell("live", palette.ok)
    since = NA if rank.seconds_since_step is None else f"{rank.seconds_since_step:.0f}s"
    return [
        _cell(rank.run),
        _cell(rank.rank, "bold"),
        _cell(rank.hostname or NA),
        _cell(fmt_s(rank.step_s)),
        _cell(fmt_rate(rank.steps_per_s)),
        _loader(rank.loader_wait, palette),
        _comm(rank.exposed_comm, palette),
        _cell(since),
        status,
    ]


def node_gpu_cells(gpu: NodeGpu) -> list[Text]:
    """One GPU a node's exporter reads, with the ranks joined to it."""
    used, total = gpu.memory_used_bytes, gpu.memory_total_bytes
    memory = NA if used is None else f"{fmt_bytes(used)} / {fmt_bytes(total)}"
    runs = {run for run, _ in gpu.ranks}
    ranks = ", ".join(rank if len(runs) == 1 else f"{run} {rank}" for run, rank in gpu.ranks) or "none"
    return [
        _cell(gpu.hostname or NA),
        _cell(gpu.gpu, "bold"),
        _cell(gpu.model or NA),
        _cell(fmt_frac(gpu.utilization)),
        _cell(memory),
        _cell(NA if gpu.power_w is None else f"{gpu.power_w:.0f}W"),
        _cell(NA if gpu.temperature_c is None else f"{gpu.temperature_c:.0f}°C"),
        _cell(ranks),
    ]


def finding_line(finding: NodeFinding, palette: Palette) -> Text:
    """One finding of a node's own diagnosis, as a line."""
    style = {"critical": palette.bad, "warn": palette.warn}.get(finding.severity, "")
    where = [f"run {finding.run}"] if finding.run else []
    where += [f"rank {finding.rank}"] if finding.rank else []
    where += [f"GPU {finding.gpu}"] if finding.gpu else []
    where += [f"on {finding.hostname}"] if finding.hostname else []
    return Text.assemble((f"{finding.severity:<9}", style), (f"{finding.cause:<15}", "bold"), " ".join(where))
