"""How numbers read on screen: one place for units, N/A and bars.

Pure functions returning plain strings, so the table, the panels, the detail
screen and the tests agree on "14.2ms" and "N/A".
"""

from __future__ import annotations

from gputop.model.work import si_parts

NA = "N/A"
GIB = 1024**3
_EIGHTHS = " ▏▎▍▌▋▊▉"


def fmt_s(seconds: float | None) -> str:
    """A duration of a step or phase: "840µs", "14.2ms", "1.23s"."""
    if seconds is None:
        return NA
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g}ms" if seconds < 0.1 else f"{seconds * 1e3:.0f}ms"
    return f"{seconds:.3g}s"


def fmt_frac(frac: float | None) -> str:
    """A share of step time, as a whole percentage: "41%"."""
    if frac is None:
        return NA
    return f"{frac * 100:.0f}%"


def fmt_pct(pct: float | None) -> str:
    """A percentage already in 0..100 (GPU util, CPU where 100 = one core)."""
    if pct is None:
        return NA
    return f"{pct:.0f}%"


def fmt_gib(n_bytes: int | float | None, *, digits: int = 1) -> str:
    """Memory in GiB without the unit letter: "61.2"."""
    if n_bytes is None:
        return NA
    return f"{n_bytes / GIB:.{digits}f}"


def fmt_bytes(n_bytes: int | float | None) -> str:
    """Memory with a unit: "12K", "512M", "61.2G"."""
    if n_bytes is None:
        return NA
    if n_bytes < 1024**2:
        return f"{n_bytes / 1024:.0f}K"
    if n_bytes < GIB:
        return f"{n_bytes / 1024**2:.0f}M"
    return f"{n_bytes / GIB:.1f}G"


def fmt_flops(flops: float | None) -> str:
    """FLOPs in three figures and an SI prefix: "79.7M", "11.1G", "6.13T"; N/A when not counted."""
    return NA if flops is None else "".join(si_parts(flops))


def fmt_mfu(mfu: float | None) -> str:
    """MFU as a percentage with one decimal under 10% ("2.4%"), none above ("41%"); N/A where not counted."""
    if mfu is None:
        return NA
    pct = 100.0 * mfu
    return f"{pct:.1f}%" if pct < 9.95 else f"{pct:.0f}%"


def fmt_rate(per_s: float | None) -> str:
    """A throughput: "812", "12.4k"."""
    if per_s is None:
        return NA
    if per_s >= 10_000:
        return f"{per_s / 1000:.0f}k"
    if per_s >= 1000:
        return f"{per_s / 1000:.1f}k"
    if per_s >= 10:
        return f"{per_s:.0f}"
    return f"{per_s:.2g}"


def fmt_uptime(seconds: float) -> str:
    """How long a run has been seen: "42s", "3m05s", "2h07m"."""
    seconds = max(int(seconds), 0)
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def bar(frac: float | None, width: int) -> str:
    """A horizontal bar ``width`` cells wide, filled to ``frac`` in eighths."""
    if width <= 0:
        return ""
    if frac is None:
        return "·" * width
    eighths = round(min(max(frac, 0.0), 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (_EIGHTHS[part] if part else "")
    return text.ljust(width)


def fmt_small_frac(frac: float | None) -> str:
    """A share that is meant to be tiny (gputop's own cost): "0.21%", "1.4%"."""
    if frac is None:
        return NA
    pct = frac * 100
    return f"{pct:.2f}%" if pct < 1 else f"{pct:.1f}%"


def fmt_us(seconds: float | None) -> str:
    """A duration of microseconds, with one decimal below 10: "1.3µs", "42µs"."""
    if seconds is None:
        return NA
    us = seconds * 1e6
    return f"{us:.1f}µs" if us < 10 else f"{us:.0f}µs"
