"""``gputop report``: a recording (or a live store) summarised per run, rank and GPU.

``build`` turns a snapshot into plain data (what ``--format json`` prints);
``to_text`` and ``to_markdown`` render that data.  No I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gputop.collect.store import LOST, Snapshot
from gputop.diagnose.findings import Finding
from gputop.stats import RankStats, rank_stats


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else round(fraction * 100.0, 2)


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def rank_entry(rank: int, stats: RankStats, **extra: Any) -> dict[str, Any]:
    return {
        "rank": rank,
        "steps": stats.steps,
        "step_time_p50_ms": _ms(stats.step_time_p50_s),
        "step_time_p95_ms": _ms(stats.step_time_p95_s),
        "step_time_max_ms": _ms(stats.step_time_max_s),
        "gpu_step_time_p50_ms": _ms(stats.gpu_step_time_p50_s),
        "samples_per_s": _round(stats.samples_per_s, 1),
        "loader_wait_pct": _pct(stats.loader_wait_frac),
        "forward_ms": _ms(stats.forward_s),
        "backward_ms": _ms(stats.backward_s),
        "comm_ms": _ms(stats.comm_s),
        "comm_exposed_ms": _ms(stats.exposed_comm_s),
        "comm_exposed_pct": _pct(stats.exposed_comm_frac),
        "mem_peak_bytes": stats.mem_peak_bytes,
        "alloc_retries": stats.alloc_retries,
        "ooms": stats.ooms,
        "cpu_pct": _round(stats.cpu_pct, 1),
        "rss_bytes": stats.rss_bytes,
        "workers": stats.workers,
        "workers_cpu_pct": _round(stats.workers_cpu_pct, 1),
        "dropped_windows": stats.dropped,
        **extra,
    }


def build(
    snapshot: Snapshot,
    findings: Sequence[Finding] = (),
    *,
    gpus: dict[str, Any] | None = None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The report as plain data; rank figures cover every window in the snapshot."""
    runs = []
    for run in snapshot.runs:
        ranks = []
        for view in run.ranks:
            stats = rank_stats(view.windows)
            ranks.append(
                rank_entry(
                    view.rank,
                    stats,
                    host=view.hello.hostname,
                    pid=view.hello.pid,
                    device=view.hello.device,
                    device_uuid=view.hello.device_uuid,
                    status=view.status,
                    status_reason=view.status_reason,
                    lost=view.status == LOST,
                )
            )
        t0 = min((r.windows[0].t0 for r in run.ranks if r.windows), default=None)
        t1 = max((r.windows[-1].t1 for r in run.ranks if r.windows), default=None)
        runs.append(
            {
                "run_id": run.run_id,
                "name": run.name,
                "world_size": run.world_size,
                "duration_s": None if t0 is None or t1 is None else round(t1 - t0, 2),
                "ranks": ranks,
            }
        )
    return {
        "runs": runs,
        "findings": [f.to_dict() for f in findings],
        "gpus": gpus if gpus is not None else {},
        "notes": list(notes),
    }


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2)


def _fmt(value: Any, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "N/A"
    if isinstance(value, float):
        return f"{value:.{digits}f}{unit}"
    return f"{value}{unit}"


def _gib(value: int | None) -> str:
    return "N/A" if value is None else f"{value / 2**30:.2f}GiB"


_COLUMNS = (
    ("rank", "rank", lambda r: _fmt(r["rank"])),
    ("status", "status", lambda r: r["status"]),
    ("steps", "steps", lambda r: _fmt(r["steps"])),
    ("p50 ms", "step_time_p50_ms", lambda r: _fmt(r["step_time_p50_ms"])),
    ("p95 ms", "step_time_p95_ms", lambda r: _fmt(r["step_time_p95_ms"])),
    ("samples/s", "samples_per_s", lambda r: _fmt(r["samples_per_s"])),
    ("loader %", "loader_wait_pct", lambda r: _fmt(r["loader_wait_pct"])),
    ("fwd ms", "forward_ms", lambda r: _fmt(r["forward_ms"])),
    ("bwd ms", "backward_ms", lambda r: _fmt(r["backward_ms"])),
    ("comm exp %", "comm_exposed_pct", lambda r: _fmt(r["comm_exposed_pct"])),
    ("mem peak", "mem_peak_bytes", lambda r: _gib(r["mem_peak_bytes"])),
    ("cpu %", "cpu_pct", lambda r: _fmt(r["cpu_pct"], digits=0)),
)


def _rank_rows(run: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = [name for name, _, _ in _COLUMNS]
    rows = [[cell(r) for _, _, cell in _COLUMNS] for r in run["ranks"]]
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
    return lines


def to_text(report: dict[str, Any], gpu_lines: Sequence[str] = ()) -> str:
    out: list[str] = []
    if not report["runs"]:
        out.append("No run reported while recording.")
    for run in report["runs"]:
        duration = f", {run['duration_s']:.1f} s" if run["duration_s"] is not None else ""
        name = f" ({run['name']})" if run["name"] else ""
        out.append(f"Run {run['run_id']}{name}: world size {run['world_size']}{duration}")
        header, rows = _rank_rows(run)
        widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
        out.append("  " + "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=False)))
        for row in rows:
            out.append("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=False)))
        out.append("")
    if gpu_lines:
        out.extend(gpu_lines)
        out.append("")
    out.append("Findings:")
    out.extend("  " + line for line in _finding_lines(report))
    for note in report["notes"]:
        out.append(f"note: {note}")
    return "\n".join(out) + "\n"


def to_markdown(report: dict[str, Any], gpu_lines: Sequence[str] = ()) -> str:
    out = ["# gputop report", ""]
    for run in report["runs"]:
        out.append(f"## Run `{run['run_id']}` ({run['name']}), world size {run['world_size']}")
        out.append("")
        header, rows = _rank_rows(run)
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---:|" * len(header))
        out.extend("| " + " | ".join(row) + " |" for row in rows)
        out.append("")
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
    for note in report["notes"]:
        out.append(f"\n> note: {note}")
    return "\n".join(out) + "\n"
