"""The work each step does, as the report, the detail screen and ``gputop mcp`` say it (docs/mfu.md).

FLOPs a step and the FLOP/s the rank's steps achieved are the reporter's count (``RankStats``); the device's
peak and the MFU are ``RankFigures.work_peak`` and ``RankFigures.mfu``.  Here they are put in the report's units,
with the note that says why a figure is N/A or what it leaves out.
"""

from __future__ import annotations

from typing import Any

from gputop.model.figures import RankFigures


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def work_entry(figures: RankFigures) -> dict[str, Any]:
    """The work each step does (docs/mfu.md): FLOPs a step, the FLOP/s achieved, the device's peak and the MFU;
    None for N/A, and ``work_note`` saying why (or what a figure leaves out)."""
    stats, hello = figures.stats, figures.hello
    peak, peak_is = figures.work_peak
    if stats.work.flops_per_step is None:
        note = hello.flops_note or "the model's FLOPs were not counted"
    elif peak is None:
        note = f"MFU: {peak_is}" + (f"; {hello.flops_note}" if hello.flops_note else "")
    else:
        note = hello.flops_note or ""
    return {
        "flops_per_step": None if stats.work.flops_per_step is None else round(stats.work.flops_per_step),
        "achieved_flops_per_s": _round(stats.work.achieved_flops_per_s, 0),
        "peak_flops_per_s": _round(peak, 0),
        "peak_is": peak_is if peak is not None else None,
        "mfu_pct": None if figures.mfu is None else round(100.0 * figures.mfu, 3),
        "work_note": note or None,
    }


def work_text(entry: dict[str, Any]) -> str:
    """'work a step: 1.23 GFLOP, 4.5 GFLOP/s achieved, MFU 2.3% of 200 GFLOP/s (…)', or why it is N/A."""
    if entry.get("flops_per_step") is None:
        return f"work a step: N/A ({entry.get('work_note') or 'not counted'})"
    text = f"work a step: {flops_text(entry['flops_per_step'])}, {flops_text(entry['achieved_flops_per_s'])}/s achieved"
    if entry.get("mfu_pct") is not None:
        text += f", MFU {entry['mfu_pct']:.1f}% of {flops_text(entry['peak_flops_per_s'])}/s ({entry['peak_is']})"
    if entry.get("work_note"):
        text += f"; {entry['work_note']}"
    return text


def si_parts(flops: float) -> tuple[str, str]:
    """A count of FLOPs in three figures and its SI prefix: ("1.23", "G"), ("512", "")."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if flops >= scale:
            return f"{flops / scale:.3g}", prefix
    return f"{flops:.0f}", ""


def flops_text(flops: float) -> str:
    """FLOPs the way a person reads them: "512 FLOP", "3.4 MFLOP", "1.23 GFLOP", "4.5 TFLOP"."""
    value, prefix = si_parts(flops)
    return f"{value} {prefix}FLOP"
