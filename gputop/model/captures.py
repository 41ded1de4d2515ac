"""Profiler captures side by side: the busiest operators of several ranks in one table.

Pure: capture results in, rows of text out.  ``gputop capture`` prints the
table and the rank detail screen shows it, so both say the same.  Times are
per captured step, so ranks that captured different step counts compare.
"""

from __future__ import annotations

from collections.abc import Sequence

from gputop.protocol import TOP_OPS, CaptureResult

NA = "N/A"


def _ms(seconds: float | None) -> str:
    return NA if seconds is None else f"{seconds * 1e3:.2f}"


def compare(results: Sequence[CaptureResult], n: int = TOP_OPS) -> tuple[list[str], list[list[str]]]:
    """Header and rows: the n operators with the most self time over all ranks, ms per step on each rank.

    An operator missing from a rank's top list reads N/A there (it was not among
    that rank's busiest), never 0.
    """
    ok = sorted((r for r in results if r.ok and r.steps > 0), key=lambda r: (r.run_id, r.rank))
    device = any(op.self_device_s for r in ok for op in r.top_ops)
    totals: dict[str, float] = {}
    for result in ok:
        for top in result.top_ops:
            totals[top.name] = totals.get(top.name, 0.0) + (top.self_cpu_s + (top.self_device_s or 0.0)) / result.steps
    names = sorted(totals, key=lambda name: -totals[name])[:n]
    header = ["operator"]
    for result in ok:
        header.append(f"r{result.rank} CPU ms/step")
        if device:
            header.append(f"r{result.rank} GPU ms/step")
    rows = []
    for name in names:
        row = [name]
        for result in ok:
            op = next((o for o in result.top_ops if o.name == name), None)
            row.append(_ms(None if op is None else op.self_cpu_s / result.steps))
            if device:
                row.append(_ms(None if op is None or op.self_device_s is None else op.self_device_s / result.steps))
        rows.append(row)
    return header, rows


def render(results: Sequence[CaptureResult], n: int = TOP_OPS) -> list[str]:
    """The comparison as aligned text lines, then each rank's trace file or why it has none."""
    header, rows = compare(results, n)
    lines: list[str] = []
    if rows:
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
        lines.append("  ".join(h.ljust(widths[0]) if i == 0 else h.rjust(widths[i]) for i, h in enumerate(header)))
        for row in rows:
            lines.append("  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(row)))
        lines.append("")
    for result in sorted(results, key=lambda r: (r.run_id, r.rank)):
        if result.ok:
            lines.append(
                f"rank {result.rank}: {result.steps} steps in {result.wall_s:.3f} s, trace {result.trace_path}"
            )
        else:
            lines.append(f"rank {result.rank}: no capture: {result.error}")
    return lines
