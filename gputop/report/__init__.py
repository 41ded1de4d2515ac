"""``gputop report``: a recording (or a live store) summarised per run, rank and GPU.

``build`` turns the figures of a whole run (``summarize(snapshot, span_s=None)``)
into plain data (what ``--format json`` prints); ``to_text`` and
``to_markdown`` render that data.  The rank figures are the model's, the same
the dashboard shows and the findings quote.  No I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

from gputop.combine import OWN_PHASES
from gputop.diagnose import Finding, diagnose
from gputop.diagnose.autocapture import captures_in, with_captures
from gputop.diagnose.thresholds import MIN_STEPS
from gputop.diagnose.waste import idle_gpus, run_gpu_util_pct
from gputop.diagnose.wording import hours_text
from gputop.model.collectives import collectives_text, size_text
from gputop.model.figures import Figures, GputopCost, RankFigures, summarize
from gputop.model.frames import span_frames
from gputop.model.gpu_summary import summarize_gpus
from gputop.model.jobs import job_ids, job_text
from gputop.model.snapshot import LOST, Snapshot
from gputop.model.work import work_entry, work_text
from gputop.report.gpus import format_gpu_summary_text


def _ms(seconds: float | None) -> float | None:
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
    stats, view = figures.stats, figures.view
    frames = span_frames(figures)
    return {
        "rank": figures.rank,
        "steps": stats.steps,
        "step_time_p50_ms": _ms(stats.step.p50_s),
        "step_time_p95_ms": _ms(stats.step.p95_s),
        "step_time_max_ms": _ms(stats.step.max_s),
        "gpu_step_time_p50_ms": _ms(stats.step.gpu_p50_s),
        "samples_per_s": _round(stats.step.samples_per_s, 1),
        "loader_wait_pct": _pct(stats.phases.loader_wait_frac),
        "micro_batches_per_step": _round(stats.phases.micro_batches, 2),
        # Each phase of the rank's own work (gputop.combine.PHASES) but the loader's, as "<phase>_ms".
        **{f"{p.name}_ms": _ms(getattr(stats.phases, p.seconds)) for p in OWN_PHASES if p.name != "loader"},
        "comm_ms": _ms(stats.phases.comm_s),
        "comm_exposed_ms": _ms(stats.phases.exposed_comm_s),
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
        "stall_mean_ms": _ms(stats.stalls.mean_s),
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
                "name": run.view.name,
                "world_size": run.world_size,
                "duration_s": None if t0 is None or t1 is None else round(t1 - t0, 2),
                "ranks": [rank_entry(r) for r in run.ranks],
                "gputop_cost": cost_entry(run.gputop_cost),
                "idle_gpus": idle_entry(idle_gpus([run], run_gpu_util_pct(figures, run)), price_per_hour),
                "job": job_ids(run.view.ranks[0].hello) if run.view.ranks else {},
                "job_text": job_text(run.view.ranks[0].hello) if run.view.ranks else "",
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


def idle_text(idle: IdleEntry | None) -> str | None:
    """ "its 4 GPUs sit idle 1.3 GPU-hours every hour (3.25 an hour at the price given)"."""
    if idle is None:
        return None
    gpus = f"{idle['gpus']} GPU{'s' if idle['gpus'] != 1 else ''}"
    text = f"its {gpus} sit idle {hours_text(idle['gpu_hours_per_hour'])} GPU-hours every hour"
    if "money_per_hour" in idle:
        text += f" ({idle['money_per_hour']:,.2f} an hour at the price given)"
    return text


def cost_entry(cost: GputopCost) -> CostEntry:
    """What gputop cost a run, in the report's units."""
    hook = cost.hook_s_per_step
    return {
        "cpu_share_pct": _pct3(cost.cpu_frac),
        "reporter_cpu_pct_per_rank": _round(cost.reporter_cpu_pct, 3),
        "hook_us_per_step": _round(None if hook is None else hook * 1e6, 2),
        "sent_bytes_per_s": _round(cost.sent_bytes_per_s, 0),
    }


def cost_text(cost: CostEntry, process_cpu_pct: float | None) -> str | None:
    """ "gputop's own cost: 0.21% of the ranks' CPU ..." or None when no reporter accounted for itself."""
    if cost["cpu_share_pct"] is None and cost["hook_us_per_step"] is None:
        return None
    parts = [
        f"{_fmt(cost['cpu_share_pct'], '%', 2)} of the ranks' CPU",
        f"reporter thread {_fmt(cost['reporter_cpu_pct_per_rank'], '% of a core per rank', 2)}",
        f"{_fmt(cost['hook_us_per_step'], ' µs per step on the training thread', 1)}",
        f"{_fmt(None if cost['sent_bytes_per_s'] is None else cost['sent_bytes_per_s'] / 1024, ' KiB/s sent', 1)}",
    ]
    if process_cpu_pct is not None:
        parts.append(f"this recorder {process_cpu_pct:.1f}% of a core")
    return "gputop's own cost: " + ", ".join(parts)


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


def of_snapshot(snapshot: Snapshot, notes: Sequence[str] = (), price_per_hour: float | None = None) -> dict[str, Any]:
    """The whole report of a snapshot's runs, over each rank's whole history, as plain data (``--format json``)."""
    figures = summarize(snapshot, span_s=None)
    # A profile the recorder had taken of a finding's culprit rank is in the recording: it goes on the finding.
    findings = with_captures(diagnose(figures), captures_in(figures))
    gpus = summarize_gpus(list(snapshot.gpu_samples()), snapshot)
    return build(figures, findings, gpus=gpus, notes=[*notes, *undecided_notes(figures)], price_per_hour=price_per_hour)


def render(snapshot: Snapshot, fmt: str, notes: Sequence[str] = (), price_per_hour: float | None = None) -> str:
    """The whole report of a snapshot's runs, over each rank's whole history, as text, markdown or json."""
    data = of_snapshot(snapshot, notes, price_per_hour)
    if fmt == "json":
        return to_json(data) + "\n"
    gpu_lines = format_gpu_summary_text(data["gpus"])
    if fmt == "markdown":
        return to_markdown(data, gpu_lines)
    return to_text(data, gpu_lines)


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2)


def _fmt(value: object, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "N/A"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def _gib(value: int | None) -> str:
    return "N/A" if value is None else f"{value / 2**30:.2f}GiB"


def _cell(key: str) -> Callable[[dict[str, Any]], str]:
    return lambda row: _fmt(row.get(key))


_COLUMNS: tuple[tuple[str, str, Callable[[dict[str, Any]], str]], ...] = (
    ("rank", "rank", lambda r: _fmt(r["rank"])),
    ("status", "status", lambda r: r["status"]),
    ("steps", "steps", lambda r: _fmt(r["steps"])),
    ("p50 ms", "step_time_p50_ms", lambda r: _fmt(r["step_time_p50_ms"])),
    ("p95 ms", "step_time_p95_ms", lambda r: _fmt(r["step_time_p95_ms"])),
    ("samples/s", "samples_per_s", lambda r: _fmt(r["samples_per_s"])),
    ("loader %", "loader_wait_pct", lambda r: _fmt(r["loader_wait_pct"])),
    *((f"{p.short} ms", f"{p.name}_ms", _cell(f"{p.name}_ms")) for p in OWN_PHASES if p.name != "loader"),
    ("comm exp %", "comm_exposed_pct", lambda r: _fmt(r["comm_exposed_pct"])),
    ("mem peak", "mem_peak_bytes", lambda r: _gib(r["mem_peak_bytes"])),
    ("cpu %", "cpu_pct", lambda r: _fmt(r["cpu_pct"], digits=0)),
    ("cpu wait %", "cpu_starved_pct", lambda r: _fmt(r["cpu_starved_pct"], digits=0)),
)


# A phase only some reporters measure (the optimizer's) has no column where no rank measured it.
_OPTIONAL_KEYS = frozenset(f"{p.name}_ms" for p in OWN_PHASES if p.optional)


def _rank_rows(run: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    columns = [c for c in _COLUMNS if c[1] not in _OPTIONAL_KEYS or any(r.get(c[1]) is not None for r in run["ranks"])]
    header = [name for name, _, _ in columns]
    rows = [[cell(r) for _, _, cell in columns] for r in run["ranks"]]
    return header, rows


def _finding_lines(report: dict[str, Any]) -> list[str]:
    if not report["findings"]:
        return ["No findings: nothing crossed a diagnosis threshold."]
    lines = []
    for f in report["findings"]:
        where = f" (ranks {', '.join(map(str, f['ranks']))})" if f["ranks"] else ""
        lines.append(f"[{f['severity'].upper()}] {f['cause']}{where}: {f['title']}")
        for e in f["evidence"]:
            lines.append(f"    evidence: {e['text']}")
        lines.append(f"    fix: {f['suggestion']}")
        if f.get("worth"):
            lines.append(f"    {f['worth']}")
        if f.get("capture"):
            lines.append(f"    {f['capture']['text']}")
    return lines


def to_text(report: dict[str, Any], gpu_lines: Sequence[str] = ()) -> str:
    out: list[str] = []
    if not report["runs"]:
        out.append("No run reported while recording.")
    for run in report["runs"]:
        duration = f", {run['duration_s']:.1f} s" if run["duration_s"] is not None else ""
        name = f" ({run['name']})" if run["name"] else ""
        out.append(f"Run {run['run_id']}{name}: world size {run['world_size']}{duration}")
        if run["job_text"]:
            out.append(f"  job: {run['job_text']}")
        cost = cost_text(run["gputop_cost"], report["gputop_process_cpu_pct"])
        if cost:
            out.append(f"  {cost}")
        if idle := idle_text(run.get("idle_gpus")):
            out.append(f"  {idle}")
        header, rows = _rank_rows(run)
        widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
        out.append("  " + "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=False)))
        for row in rows:
            out.append("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=False)))
        out.extend(f"  rank {r['rank']} {r['frames_text']}" for r in run["ranks"] if r.get("frames_text"))
        out.extend(
            f"  rank {r['rank']} collectives a step: {collectives_text(r['collectives'])}"
            for r in run["ranks"]
            if r.get("collectives")
        )
        out.extend(f"  rank {r['rank']} {work_text(r)}" for r in run["ranks"] if "flops_per_step" in r)
        out.append("")
    if gpu_lines:
        out.extend(gpu_lines)
        out.append("")
    out.append("Findings:")
    out.extend("  " + line for line in _finding_lines(report))
    for note in report["notes"]:
        out.append(f"note: {note}")
    return "\n".join(out) + "\n"


def _collectives_table(ranks: Sequence[dict[str, Any]]) -> list[str]:
    """The markdown table of each rank's collectives a step; nothing where none was timed."""
    rows = [(r["rank"], c) for r in ranks for c in r.get("collectives") or ()]
    if not rows:
        return []
    out = ["Collectives, a step:", "", "| rank | collective | group | calls | bytes | in flight ms | exposed ms |",
           "|---:|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for rank, c in rows:
        cells = (rank, c["kind"], c["group"], f"{c['calls_per_step']:g}", size_text(c["bytes_per_step"]),
                 _fmt(c["in_flight_ms"]), _fmt(c["exposed_ms"]))  # fmt: skip
        out.append("| " + " | ".join(map(str, cells)) + " |")
    return [*out, ""]


def to_markdown(report: dict[str, Any], gpu_lines: Sequence[str] = ()) -> str:
    out = ["# gputop report", ""]
    for run in report["runs"]:
        out.append(f"## Run `{run['run_id']}` ({run['name']}), world size {run['world_size']}")
        out.append("")
        if run["job_text"]:
            out += [f"Job: {run['job_text']}", ""]
        cost = cost_text(run["gputop_cost"], report["gputop_process_cpu_pct"])
        if cost:
            out += [cost, ""]
        if idle := idle_text(run.get("idle_gpus")):
            out += [idle[0].upper() + idle[1:] + ".", ""]
        header, rows = _rank_rows(run)
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---:|" * len(header))
        out.extend("| " + " | ".join(row) + " |" for row in rows)
        out.append("")
        where = [f"- rank {r['rank']} {r['frames_text']}" for r in run["ranks"] if r.get("frames_text")]
        if where:
            out += ["Where each training thread was (stack samples):", "", *where, ""]
        out += _collectives_table(run["ranks"])
    if gpu_lines:
        out.append("## GPUs")
        out.append("")
        out.extend(f"    {line}" for line in gpu_lines)
        out.append("")
    out.append("## Findings")
    out.append("")
    if not report["findings"]:
        out.append("No findings: nothing crossed a diagnosis threshold.")
    for f in report["findings"]:
        ranks = f" — ranks {', '.join(map(str, f['ranks']))}" if f["ranks"] else ""
        out.append(f"- **{f['severity']}** `{f['cause']}`{ranks}: {f['title']}")
        for e in f["evidence"]:
            out.append(f"  - evidence: {e['text']}")
        out.append(f"  - fix: {f['suggestion']}")
        if f.get("worth"):
            out.append(f"  - {f['worth']}")
        if f.get("capture"):
            out.append(f"  - {f['capture']['text']}")
    for note in report["notes"]:
        out.append(f"\n> note: {note}")
    return "\n".join(out) + "\n"
