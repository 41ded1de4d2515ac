"""What each row of the ranks table says: its columns, sort orders, and cells as Rich Text.

Pure formatting of ``RankRow``/``HostRow`` (no widget), so the figures test
can check that the table says what the report says, and the table can cache
a row's rendering by its cells' content.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.console import JustifyMethod
from rich.text import Text

from gputop.diagnose.findings import Finding
from gputop.model.snapshot import DONE, LIVE
from gputop.tui.format import NA, fmt_bytes, fmt_flops, fmt_frac, fmt_gib, fmt_mfu, fmt_pct, fmt_rate, fmt_s
from gputop.tui.palette import Palette
from gputop.tui.view import HostRow, RankRow

Entry = RankRow | HostRow  # a row of the table

SLOWEST_MARK = "▲"
FOLD_ABOVE = 16  # more ranks than this on several hosts: hosts start folded
PHASE_GLYPH = "█"
FOLDED, UNFOLDED = "▸", "▾"
GROUPED_RANK_WIDTH = 11  # "▸ node-0031": host rows name their host in the rank column


@dataclass(frozen=True)
class Column:
    """A table column: its key, header, width, and whether it shows on narrow screens."""

    key: str
    label: str
    width: int
    narrow: bool = True  # shown on narrow tables
    wide: bool = True  # shown on wide tables
    roomy: bool = False  # shown only where the table has room for every column (ROOMY_FROM)


COLUMNS = (
    Column("run", "run", 12),
    Column("rank", "rank", 5),
    Column("host", "host", 10, narrow=False),
    Column("gpu", "GPU", 4),
    Column("phases", "step phases", 16, narrow=False),
    Column("bar", "step", 8, wide=False),
    Column("step", "step p50", 8),
    Column("samples", "samples/s", 9),
    Column("loader", "loader", 6),
    Column("comm", "comm", 6),
    Column("mem", "memory", 8),
    Column("flops", "FLOP/step", 9, narrow=False, roomy=True),
    Column("flops_s", "FLOP/s", 6, narrow=False, roomy=True),
    Column("mfu", "MFU", 5, narrow=False),
    Column("cpu", "CPU%", 5, narrow=False),
    Column("status", "state", 5),
)


# The table's width under which host, the wide phase bar and CPU% give way: every wide
# column with its cell padding, and the vertical scrollbar's 2 cells.
NARROW_BELOW = sum(c.width + 2 for c in COLUMNS if c.wide and not c.roomy and c.key != "run") + 2
# And from which the work a step does shows in full (FLOPs a step and the FLOP/s achieved, beside the MFU).
ROOMY_FROM = NARROW_BELOW + sum(c.width + 2 for c in COLUMNS if c.roomy)


@dataclass(frozen=True)
class SortKey:
    """One way to order the ranks; rows without the value (N/A) go last."""

    name: str  # shown in the panel title
    column: str  # the column whose header gets the arrow
    value: Callable[[RankRow], float | None]
    descending: bool = True  # worst (largest) first


SORT_KEYS = (
    SortKey("rank", "rank", lambda r: float(r.rank), descending=False),
    SortKey("step p50", "step", lambda r: r.stats.step.p50_s),
    SortKey("loader wait", "loader", lambda r: r.stats.phases.loader_wait_frac),
    SortKey("exposed comm", "comm", lambda r: r.stats.phases.exposed_comm_frac),
    SortKey("samples/s", "samples", lambda r: r.stats.step.samples_per_s, descending=False),
    SortKey("memory", "mem", lambda r: r.stats.memory.allocated_bytes),
    SortKey("MFU", "mfu", lambda r: r.mfu, descending=False),
    SortKey("CPU%", "cpu", lambda r: r.stats.cpu.pct),
)


def sort_rows(rows: Sequence[RankRow], key: SortKey) -> list[RankRow]:
    """Rows grouped by run (in the order runs appeared), ordered by ``key`` inside each run."""
    run_order: dict[str, int] = {}
    for row in rows:
        run_order.setdefault(row.run_id, len(run_order))

    def order(row: RankRow) -> tuple[int, int, float, int]:
        value = key.value(row)
        missing = 1 if value is None else 0
        number = 0.0 if value is None else (-value if key.descending else value)
        return (run_order[row.run_id], missing, number, row.rank)

    return sorted(rows, key=order)


def phase_text(phases: Sequence[tuple[str, float | None]], width: int, palette: Palette) -> Text:
    """A step as a stacked bar of ``width`` cells, coloured by phase; dots when nothing is timed."""
    known = [(name, s) for name, s in phases if s is not None and s > 0]
    total = sum(s for _, s in known)
    if total <= 0 or any(s is None for _, s in phases):
        # A bar with a phase missing would put its time in the others: say N/A instead.
        return Text("·" * width, style=palette.muted)
    text = Text()
    used = 0
    for i, (name, seconds) in enumerate(known):
        cells = width - used if i == len(known) - 1 else min(round(seconds / total * width), width - used)
        used += cells
        text.append(PHASE_GLYPH * cells, style=palette.phase(name))
    return text


def sort_hosts(hosts: Sequence[HostRow], key: SortKey) -> list[HostRow]:
    """Hosts grouped by run, ordered by the same key as their ranks (their summary's value)."""
    run_order: dict[str, int] = {}
    for host in hosts:
        run_order.setdefault(host.run_id, len(run_order))
    values: dict[str, Callable[[HostRow], float | None]] = {
        "step": lambda h: h.step_time_p50_s,
        "loader": lambda h: h.loader_wait_frac,
        "comm": lambda h: h.exposed_comm_frac,
        "samples": lambda h: h.samples_per_s,
        "cpu": lambda h: h.cpu_pct,
        "mfu": lambda h: h.mfu,
    }
    value = values.get(key.column)

    def order(item: tuple[int, HostRow]) -> tuple[int, int, float, int]:
        index, host = item
        v = value(host) if value is not None else None
        number = 0.0 if v is None else (-v if key.descending else v)
        return (run_order[host.run_id], 1 if v is None else 0, number, index)

    return [h for _, h in sorted(enumerate(hosts), key=order)]


def _na(palette: Palette, justify: JustifyMethod = "right") -> Text:
    """N/A, dim: never a zero, so "not measured" cannot be read as "none"."""
    return Text(NA, style=palette.muted, justify=justify)


def _frac_cell(frac: float | None, palette: Palette, warn_at: float, bad_at: float) -> Text:
    if frac is None:
        return _na(palette)
    return Text(fmt_frac(frac), style=palette.level(frac, warn_at, bad_at), justify="right")


def _mfu_cell(mfu: float | None, palette: Palette) -> Text:
    return _na(palette) if mfu is None else Text(fmt_mfu(mfu), justify="right")


def _flops_cell(flops: float | None, palette: Palette) -> Text:
    return _na(palette) if flops is None else Text(fmt_flops(flops), justify="right")


def row_cells(row: RankRow, palette: Palette) -> dict[str, Text]:
    """The text of every column for one rank."""
    s = row.stats
    mark = palette.bad if row.slowest else ""
    cells: dict[str, Text] = {
        "run": Text(row.run_name[:12], style="bold"),
        "rank": Text(f"{SLOWEST_MARK if row.slowest else ' '}{row.rank}", style=f"bold {mark}".strip()),
        "host": Text(row.host[:10] or NA, style="" if row.host else palette.muted),
        "gpu": Text(row.gpu, style="" if row.gpu.isdigit() else palette.muted),
        "step": Text(fmt_s(s.step.p50_s), style=mark or "", justify="right")
        if s.step.p50_s is not None
        else _na(palette),
        "samples": (
            Text(fmt_rate(s.step.samples_per_s), justify="right") if s.step.samples_per_s is not None else _na(palette)
        ),
        # Thresholds as in the PyTorch profiler's old advice: loader > 5%, communication > 10% of the step.
        "loader": _frac_cell(s.phases.loader_wait_frac, palette, 0.05, 0.20),
        "comm": _frac_cell(s.phases.exposed_comm_frac, palette, 0.10, 0.30),
        "cpu": Text(fmt_pct(s.cpu.pct), justify="right") if s.cpu.pct is not None else _na(palette),
        "mfu": _mfu_cell(row.mfu, palette),
        "flops": _flops_cell(s.work.flops_per_step, palette),
        "flops_s": _flops_cell(s.work.achieved_flops_per_s, palette),
    }
    if s.memory.allocated_bytes is None:
        cells["mem"] = _na(palette, "left")
    elif s.memory.total_bytes:
        near_full = s.memory.peak_bytes is not None and s.memory.peak_bytes > 0.95 * s.memory.total_bytes
        cells["mem"] = Text(
            f"{fmt_gib(s.memory.allocated_bytes)}/{fmt_gib(s.memory.total_bytes, digits=0)}G",
            style=palette.warn if near_full else "",
        )
    else:
        cells["mem"] = Text(fmt_bytes(s.memory.allocated_bytes))
    status_style = {LIVE: palette.ok, DONE: palette.muted}.get(row.status, f"bold {palette.bad}")
    cells["status"] = Text(row.status, style=status_style)
    cells["phases"] = phase_text(row.phases, 16, palette)
    cells["bar"] = phase_text(row.phases, 8, palette)
    return cells


def host_cells(host: HostRow, folded: bool, palette: Palette) -> dict[str, Text]:
    """The summary row of one host: its ranks' figures folded into one line."""
    mark = palette.bad if host.slowest else ""
    n = len(host.ranks)
    label = f"{FOLDED if folded else UNFOLDED} {host.host or NA}"
    cells: dict[str, Text] = {
        "run": Text(host.run_name[:12], style="bold"),
        "rank": Text(label[:GROUPED_RANK_WIDTH], style=f"bold {mark}".strip()),
        "host": Text(label[:10], style=f"bold {mark}".strip()),
        "gpu": Text(""),
        "step": Text(fmt_s(host.step_time_p50_s), style=mark, justify="right")
        if host.step_time_p50_s is not None
        else _na(palette),
        "samples": Text(fmt_rate(host.samples_per_s), justify="right")
        if host.samples_per_s is not None
        else _na(palette),
        "loader": _frac_cell(host.loader_wait_frac, palette, 0.05, 0.20),
        "comm": _frac_cell(host.exposed_comm_frac, palette, 0.10, 0.30),
        "cpu": Text(fmt_pct(host.cpu_pct), justify="right") if host.cpu_pct is not None else _na(palette),
        "mfu": _mfu_cell(host.mfu, palette),
        "flops": Text(""),
        "flops_s": Text(""),
        "mem": Text(""),
        "status": Text(f"{host.live}/{n}"[:5], style=palette.ok if host.live == n else f"bold {palette.bad}"),
        "phases": phase_text(host.phases, 16, palette),
        "bar": phase_text(host.phases, 8, palette),
    }
    return cells


def ordered_entries(
    rows: Sequence[RankRow],
    hosts: Sequence[HostRow],
    key: SortKey,
    grouped: bool,
    is_folded: Callable[[str], bool],
) -> list[Entry]:
    """The table's rows in order: per run, per host (a summary row, then its ranks unless folded)."""
    ordered = sort_rows(rows, key)
    if not grouped:
        return list(ordered)
    by_host: dict[str, list[RankRow]] = {}
    for row in ordered:
        by_host.setdefault(f"host:{row.run_id}:{row.host}", []).append(row)
    entries: list[Entry] = []
    for host in sort_hosts(hosts, key):
        entries.append(host)
        if not is_folded(host.key):
            entries += by_host.get(host.key, [])
    return entries


# Which column shows what a finding's evidence reads, by the evidence's metric name
# (first match wins): the table underlines those columns for the top finding.
EVIDENCE_COLUMNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("loader", ("loader",)),
    ("exposed_comm", ("comm",)),
    ("others_wait", ("comm",)),
    ("forward_pct", ("phases", "bar")),
    ("backward_pct", ("phases", "bar")),
    ("other_pct", ("phases", "bar")),
    ("own_pct", ("phases", "bar")),
    ("own_time", ("step",)),
    ("step", ("step",)),
    ("stall", ("step",)),
    ("mem", ("mem",)),
    ("alloc", ("mem",)),
    ("reserved", ("mem",)),
    ("ooms", ("mem",)),
    ("cpu", ("cpu",)),
    ("gpu", ("gpu",)),
)


@dataclass(frozen=True)
class Highlight:
    """The rows and columns a finding's evidence reads, drawn underlined in its severity's colour."""

    rank_keys: frozenset[str] = frozenset()  # "run_id:rank"
    columns: frozenset[str] = frozenset()
    style: str = ""


NO_HIGHLIGHT = Highlight()


def evidence_highlight(finding: Finding | None, rows: Sequence[RankRow], palette: Palette) -> Highlight:
    """What the table marks for ``finding``: its ranks (and its evidence's) and the columns its evidence reads."""
    if finding is None:
        return NO_HIGHLIGHT
    columns: set[str] = set()
    for evidence in finding.evidence:
        metric = evidence.metric
        columns.update(next((cols for part, cols in EVIDENCE_COLUMNS if part in metric), ()))
    ranks = set(finding.ranks) | {e.rank for e in finding.evidence if e.rank is not None}
    keys = frozenset(r.key for r in rows if r.rank in ranks and finding.run_id in (None, r.run_id))
    style = {"critical": palette.bad, "warn": palette.warn}.get(finding.severity, palette.accent)
    return Highlight(keys, frozenset(columns), style)


def highlighted(cells: dict[str, Text], highlight: Highlight) -> dict[str, Text]:
    """The cells with the highlighted columns underlined (a copy; the cells may be cached elsewhere)."""
    marked = dict(cells)
    for column in highlight.columns & cells.keys():
        text = cells[column].copy()
        text.stylize(f"underline {highlight.style}" if column not in ("phases", "bar") else "underline")
        marked[column] = text
    return marked
