"""The report's data rendered for people: plain text and markdown.

No figure is computed here: each line reads an entry of ``gputop.report.entries``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gputop.combine import OWN_PHASES
from gputop.diagnose.wording import hours_text
from gputop.model.collectives import collectives_text, size_text
from gputop.model.work import work_text
from gputop.report.entries import CostEntry, IdleEntry


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
        lines += [f"    {line}" for line in _finding_details(f)]
    return lines


def _finding_details(f: dict[str, Any]) -> list[str]:
    """A finding's lines under its title, the same in text and markdown: evidence, fix, worth, capture."""
    lines = [f"evidence: {e['text']}" for e in f["evidence"]]
    lines.append(f"fix: {f['suggestion']}")
    if f.get("worth"):
        lines.append(f["worth"])
    if f.get("capture"):
        lines.append(f["capture"]["text"])
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
        out += [f"  - {line}" for line in _finding_details(f)]
    for note in report["notes"]:
        out.append(f"\n> note: {note}")
    return "\n".join(out) + "\n"


def idle_text(idle: IdleEntry | None) -> str | None:
    """ "its 4 GPUs sit idle 1.3 GPU-hours every hour (3.25 an hour at the price given)"."""
    if idle is None:
        return None
    gpus = f"{idle['gpus']} GPU{'s' if idle['gpus'] != 1 else ''}"
    text = f"its {gpus} sit idle {hours_text(idle['gpu_hours_per_hour'])} GPU-hours every hour"
    if "money_per_hour" in idle:
        text += f" ({idle['money_per_hour']:,.2f} an hour at the price given)"
    return text


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
