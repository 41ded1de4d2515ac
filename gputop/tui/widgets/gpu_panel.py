"""One row per GPU: utilization and memory bars, power, temperature, who is on it."""

from __future__ import annotations

from textual.app import RenderResult
from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

from gputop.model.samples import GpuProcess
from gputop.tui.format import NA, bar, fmt_bytes, fmt_gib, fmt_pct
from gputop.tui.view import GpuRow

Part = str | tuple[str, str]


def _level(pct: float | None) -> str:
    """Low utilization is the problem this tool exists for, so low is the warning colour."""
    if pct is None:
        return "$text-muted"
    if pct < 30:
        return "$error"
    if pct < 70:
        return "$warning"
    return "$success"


def _bar(frac: float | None, width: int, style: str) -> list[Part]:
    filled = bar(frac, width).rstrip() if frac is not None else ""
    return [(filled, style), ("░" * (width - len(filled)), "$text-muted")]


def _others(processes: tuple[GpuProcess, ...], limit: int) -> Part:
    if not processes:
        return ""
    first = processes[0]
    text = f" +pid {first.pid}"
    if first.name:
        text += f" {first.name}"
    if first.used_bytes is not None:
        text += f" {fmt_bytes(first.used_bytes)}"
    if len(processes) > 1:
        text += f" +{len(processes) - 1} more"
    return (text[:limit], "$warning")


class GpuPanel(Widget):
    """The machine's GPUs; in compact mode several GPUs share a line."""

    DEFAULT_CSS = """
    GpuPanel {
        height: auto;
    }
    """

    rows: reactive[tuple[GpuRow, ...]] = reactive((), layout=True)
    """The GPUs with their ranks and unobserved processes."""
    unavailable: reactive[str | None] = reactive(None, layout=True)
    """Why there is no GPU data at all (shown instead of rows)."""
    waiting: reactive[bool] = reactive(True, layout=True)
    """No GPU sample has arrived yet."""
    compact: reactive[bool] = reactive(False, layout=True)
    """Pack several GPUs per line (small terminals)."""

    def render(self) -> RenderResult:
        if self.unavailable:
            return Content.assemble(("no GPU data: ", "bold $warning"), self.unavailable)
        if not self.rows:
            return Content.styled("waiting for GPU data…" if self.waiting else "no GPUs visible", "$text-muted")
        width = max(self.size.width, 20)
        if self.compact and len(self.rows) > 2:
            return self._render_compact(width)
        return Content("\n").join(self._render_row(row, width) for row in self.rows)

    def _render_row(self, row: GpuRow, width: int) -> Content:
        g = row.reading
        util_frac = g.util_pct / 100 if g.util_pct is not None else None
        mem_frac = (
            g.mem_used_bytes / g.mem_total_bytes if (g.mem_used_bytes is not None and g.mem_total_bytes) else None
        )
        power = f"{g.power_w:.0f}W" if g.power_w is not None else NA
        temp = f"{g.temp_c:.0f}°C" if g.temp_c is not None else NA
        mem = f"{fmt_gib(g.mem_used_bytes)}/{fmt_gib(g.mem_total_bytes, digits=0)}G"
        ranks = " ".join(row.ranks[:3]) + (f" +{len(row.ranks) - 3}" if len(row.ranks) > 3 else "")
        ranks = ranks or "no rank"
        show_name = width >= 120
        name = f"{g.name[:22]:<22} " if show_name else ""
        fixed = len(f"{g.index:>2} ") + len(name) + len("util  ") + 5 + len("mem  ") + len(mem) + 1
        fixed += len(f"  {power:>5} {temp:>5}  ") + min(len(ranks), 16)
        bar_w = max(min((width - fixed) // 2, 24), 4)
        parts: list[Part] = [
            (f"{g.index:>2} ", "bold"),
            (name, "$text-muted"),
            "util ",
            *_bar(util_frac, bar_w, _level(g.util_pct)),
            (f" {fmt_pct(g.util_pct):>4}", _level(g.util_pct) if g.util_pct is not None else "$text-muted"),
            "  mem ",
            *_bar(mem_frac, bar_w, "$accent"),
            f" {mem}",
            (f"  {power:>5} {temp:>5}  ", "$text-muted" if g.power_w is None else ""),
            (ranks, "bold" if row.ranks else "$text-muted"),
        ]
        used = Content.assemble(*parts).cell_length
        parts.append(_others(row.unobserved, max(width - used, 0)))
        return Content.assemble(*parts).truncate(width)

    def _render_compact(self, width: int) -> Content:
        cells = []
        for row in self.rows:
            g = row.reading
            ranks = ",".join(row.ranks) if row.ranks else "-"
            cells.append(
                Content.assemble(
                    (f"{g.index}", "bold"),
                    " ",
                    (f"{fmt_pct(g.util_pct):>4}", _level(g.util_pct)),
                    f" {fmt_gib(g.mem_used_bytes, digits=0):>3}G ",
                    (ranks[:6], "bold"),
                    ("!" if row.unobserved else " ", "bold $warning"),
                )
            )
        cell_w = max(c.cell_length for c in cells) + 2
        per_line = max(width // cell_w, 1)
        lines = []
        for start in range(0, len(cells), per_line):
            chunk = cells[start : start + per_line]
            lines.append(Content.assemble(*(c.pad_right(cell_w - c.cell_length) for c in chunk)))
        return Content("\n").join(lines)
