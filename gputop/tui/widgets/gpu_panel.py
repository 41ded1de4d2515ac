"""One row per GPU: utilization and memory bars, power, temperature, who is on it.

GPUs of several hosts (other hosts' from their node samplers) are grouped
under a line per host; when they do not fit the panel, each host folds into
one line: a utilization cell per GPU, the host's mean, and its foreign processes.
"""

from __future__ import annotations

from textual.app import RenderResult
from textual.content import Content
from textual.reactive import reactive
from textual.widget import Widget

from gputop.model.samples import GpuProcess, GpuReading
from gputop.tui.format import NA, bar, fmt_bytes, fmt_gib, fmt_pct
from gputop.tui.view import GpuRow

Part = str | tuple[str, str]
LOCAL_HOST = "this dashboard's host"  # the group of GPUs the dashboard reads itself
UTIL_CELLS = "▁▂▃▄▅▆▇█"  # an idle GPU still shows a cell
DEFAULT_LINES = 11  # when the panel's max-height is not in cells (gputop.tcss sets 12, border included)


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
        if self.unavailable and not self.rows:
            return Content.assemble(("no GPU data: ", "bold $warning"), self.unavailable)
        if not self.rows:
            return Content.styled("waiting for GPU data…" if self.waiting else "no GPUs visible", "$text-muted")
        width = max(self.size.width, 20)
        groups = self._groups()
        if len(groups) > 1 or any(host for host, _ in groups):
            return self._render_hosts(groups, width)
        if self.compact and len(self.rows) > 2:
            return self._render_compact(self.rows, width)
        return Content("\n").join(self._render_row(row, width) for row in self.rows)

    def _groups(self) -> list[tuple[str, list[GpuRow]]]:
        """Rows by host, in the order they come (this dashboard's host first, then by name)."""
        groups: dict[str, list[GpuRow]] = {}
        for row in self.rows:
            groups.setdefault(row.hostname, []).append(row)
        return list(groups.items())

    def _lines_available(self) -> int:
        limit = self.styles.max_height
        if limit is not None and limit.unit.name == "CELLS":
            return max(int(limit.value) - 1, 1)  # the border-top takes one
        return DEFAULT_LINES

    def _render_hosts(self, groups: list[tuple[str, list[GpuRow]]], width: int) -> Content:
        """A heading per host over its GPUs, or one line per host when that is too tall."""
        budget = self._lines_available()
        lines: list[Content] = []
        if self.unavailable:  # this host reads no GPU, other hosts' GPUs are here
            lines.append(Content.assemble((f"{LOCAL_HOST}: no GPU data: ", "$text-muted"), self.unavailable))
        full = sum(len(rows) + 1 for _, rows in groups)
        if not self.compact and len(lines) + full <= budget:
            for host, rows in groups:
                lines.append(self._heading(host, rows))
                lines += [self._render_row(row, width) for row in rows]
            return Content("\n").join(lines)
        room = max(budget - len(lines), 1)
        shown = groups if len(groups) <= room else groups[: room - 1]
        lines += [self._host_line(host, rows, width) for host, rows in shown]
        if len(shown) < len(groups):
            rest = groups[len(shown) :]
            lines.append(
                Content.styled(
                    f"+{len(rest)} more hosts, {sum(len(r) for _, r in rest)} GPUs (the ranks table folds by host)",
                    "$text-muted",
                )
            )
        return Content("\n").join(lines)

    @staticmethod
    def _heading(host: str, rows: list[GpuRow]) -> Content:
        foreign = sum(len(r.unobserved) for r in rows)
        return Content.assemble(
            (host or LOCAL_HOST, "bold $accent"),
            (f"  {len(rows)} GPU{'s' if len(rows) != 1 else ''}", "$text-muted"),
            (f"  {foreign} process{'es' if foreign != 1 else ''} not a rank's" if foreign else "", "$warning"),
        )

    @staticmethod
    def _host_line(host: str, rows: list[GpuRow], width: int) -> Content:
        """One host folded: a cell per GPU's utilization, the mean, memory, its ranks, foreign processes."""
        utils = [r.reading.util_pct for r in rows]
        known = [u for u in utils if u is not None]
        mean = sum(known) / len(known) if known else None
        used = sum(r.reading.mem_used_bytes or 0 for r in rows)
        total = sum(r.reading.mem_total_bytes or 0 for r in rows)
        ranks = sum(len(r.ranks) for r in rows)
        foreign = sum(len(r.unobserved) for r in rows)
        name = (host or LOCAL_HOST)[:24]
        parts: list[Part] = [(f"{name:<24} ", "bold")]
        for u in utils:
            cell = (
                "?" if u is None else UTIL_CELLS[min(int(u / 100 * (len(UTIL_CELLS) - 1) + 0.5), len(UTIL_CELLS) - 1)]
            )
            parts.append((cell, _level(u)))
        parts += [
            (f"  util {fmt_pct(mean):>4}", _level(mean)),
            f"  mem {fmt_gib(used if total else None)}/{fmt_gib(total or None, digits=0)}G",
            (f"  {ranks} rank{'s' if ranks != 1 else ''}", "" if ranks else "$text-muted"),
            (f"  {foreign} not a rank's" if foreign else "", "$warning"),
        ]
        return Content.assemble(*parts).truncate(width)

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
        link = _link_text(g) if show_name else ""
        fixed = len(f"{g.index:>2} ") + len(name) + len("util  ") + 5 + len("mem  ") + len(mem) + 1
        fixed += len(f"  {power:>5} {temp:>5}  ") + len(link) + min(len(ranks), 16)
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
            (link, "$text-muted"),
            (ranks, "bold" if row.ranks else "$text-muted"),
        ]
        used = Content.assemble(*parts).cell_length
        parts.append(_others(row.unobserved, max(width - used, 0)))
        return Content.assemble(*parts).truncate(width)

    def _render_compact(self, rows: tuple[GpuRow, ...], width: int) -> Content:
        cells = []
        for row in rows:
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


def _link_text(g: GpuReading) -> str:
    """The busiest interconnect's traffic, both ways: NVLink where the GPU has it, else PCIe ("" unknown)."""
    for label, rx, tx in (
        ("nvl", g.nvlink_rx_bytes_s, g.nvlink_tx_bytes_s),
        ("pcie", g.pcie_rx_bytes_s, g.pcie_tx_bytes_s),
    ):
        if rx is not None and tx is not None:
            return f"{label} {fmt_bytes(rx + tx)}/s  "
    return ""
