"""One rank in full: its step's phases, where its training thread is, histories, its facts and its events."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, Static

from gputop.combine import phase_seconds
from gputop.model.collectives import CollectiveFigures, bandwidth_text, last_to_arrive, size_text
from gputop.model.figures import SPAN_S, RankFigures
from gputop.model.frames import rank_frames
from gputop.model.rank_stats import RankStats
from gputop.model.snapshot import RankSnapshot
from gputop.model.work import work_entry, work_text
from gputop.protocol import Hello
from gputop.tui.format import NA, fmt_bytes, fmt_frac, fmt_pct, fmt_rate, fmt_s, fmt_small_frac, fmt_us
from gputop.tui.view import DashboardView, RankRow
from gputop.tui.widgets.captures import CapturePanel, request_captures
from gputop.tui.widgets.history import HistoryPanel
from gputop.tui.widgets.phase_bar import PhaseBar

Line = tuple[str, str | None]


def _flag(value: bool | None) -> str | None:
    return None if value is None else ("on" if value else "off")


def _num(value: int | None) -> str | None:
    return None if value is None else str(value)


def _facts(hello: Hello) -> list[tuple[str, list[Line]]]:
    """The hello's facts, grouped the way a user looks for them."""
    return [
        (
            "device",
            [
                ("device", hello.device),
                ("name", hello.device_name),
                ("uuid", hello.device_uuid),
                ("memory", fmt_bytes(hello.device_total_bytes) if hello.device_total_bytes else None),
                ("host / pid", f"{hello.hostname} / {hello.pid}"),
                ("local rank", str(hello.local_rank)),
            ],
        ),
        (
            "loader",
            [
                ("batch size", _num(hello.loader_batch_size)),
                ("num_workers", _num(hello.loader_num_workers)),
                ("pin_memory", _flag(hello.loader_pin_memory)),
                ("persistent_workers", _flag(hello.loader_persistent_workers)),
                ("prefetch_factor", _num(hello.loader_prefetch_factor)),
            ],
        ),
        (
            "precision",
            [
                ("autocast", _flag(hello.autocast)),
                ("param dtype", hello.param_dtype),
                ("TF32 matmul", _flag(hello.tf32_matmul)),
                ("TF32 cudnn", _flag(hello.tf32_cudnn)),
                ("cudnn.benchmark", _flag(hello.cudnn_benchmark)),
            ],
        ),
        (
            "runtime",
            [
                ("model", hello.model_name),
                ("DDP", _flag(hello.ddp)),
                ("backend", hello.backend),
                ("torch", hello.torch_version),
                ("torch threads / CPUs", f"{hello.torch_threads or NA} / {hello.cpu_count or NA}"),
                ("gputop", hello.gputop_version or None),
            ],
        ),
    ]


def _gpu_section(view: DashboardView, key: str) -> Content | None:
    """What NVML says of the rank's GPU, each missing figure with its reason."""
    row = next((g for g in view.gpu_rows if key in g.rank_keys), None)
    if row is None:
        return None
    g = row.reading

    def value(text: str, *fields: str) -> str | None:
        if all(getattr(g, f) is not None for f in fields):
            return text
        reason = next((g.na[f] for f in fields if f in g.na), "not read")
        return f"N/A ({reason})"

    def rates(prefix: str) -> str | None:
        rx, tx = getattr(g, f"{prefix}_rx_bytes_s"), getattr(g, f"{prefix}_tx_bytes_s")
        return value(f"rx {fmt_bytes(rx)}/s  tx {fmt_bytes(tx)}/s", f"{prefix}_rx_bytes_s", f"{prefix}_tx_bytes_s")

    lines: list[Line] = [
        ("GPU", f"{g.index}  {g.name}" + (f"  on {row.hostname}" if row.hostname else "")),
        (
            "utilization",
            value(f"a kernel ran {fmt_pct(g.util_pct)} of the time, memory busy {fmt_pct(g.mem_util_pct)}", "util_pct"),
        ),
        (
            "memory",
            value(
                f"{fmt_bytes(g.mem_used_bytes)} used of {fmt_bytes(g.mem_total_bytes)}"
                + (f", {fmt_bytes(g.mem_reserved_bytes)} reserved by the driver" if g.mem_reserved_bytes else ""),
                "mem_used_bytes",
            ),
        ),
        ("PCIe", rates("pcie")),
        ("NVLink", rates("nvlink")),
    ]
    if row.from_other_namespace:
        pids = ", ".join(str(p.pid) for p in row.from_other_namespace)
        lines.append(("processes", f"NVML reports PIDs from another namespace ({pids}): taken as this GPU's ranks'"))
    return _section("GPU (NVML)", lines)


def _work_text(figures: RankFigures | None) -> str:
    """The work a step does: FLOPs, FLOP/s achieved, MFU against the device's peak; N/A with why (docs/mfu.md)."""
    if figures is None:
        return NA
    return work_text(work_entry(figures)).removeprefix("work a step: ")


def _cost_text(s: RankStats) -> str:
    """What gputop costs this rank, from its reporter's self-accounting."""
    if s.cost.cpu_frac is None and s.cost.hook_s_per_step is None:
        return "N/A (this rank's reporter does not account for itself)"
    core = None if s.cost.reporter_cpu_pct is None else s.cost.reporter_cpu_pct / 100
    return (
        f"{fmt_small_frac(s.cost.cpu_frac)} of this rank's CPU: reporter thread {fmt_small_frac(core)} of a core, "
        f"{fmt_us(s.cost.hook_s_per_step)} per step in its hooks, {fmt_bytes(s.cost.sent_bytes_per_s)}/s sent"
    )


def _frames_section(rank: RankSnapshot, now_t: float) -> Content | None:
    """Where the training thread is now and where it spent the span, from its reporter's stack samples.

    None when the rank sends none (an older gputop, or GPUTOP_STACKS=0).
    """
    frames = rank_frames(rank, since_t=now_t - SPAN_S)
    if frames is None:
        return None
    rate = f"{1 / frames.interval_s:.0f}/s" if frames.interval_s else "?"
    out = [
        Content.assemble(
            ("where the training thread is", "bold $accent"),
            (f"   sampled {rate}, {frames.samples} samples in the last {SPAN_S:.0f} s", "$text-muted"),
        ),
        Content.assemble(
            ("  now    ", "bold"),
            frames.now.text() if frames.now is not None else ("not sampled (its thread has ended)", "$text-muted"),
            (f"   {max(now_t - frames.now_t, 0.0):.0f} s ago", "$text-muted"),
        ),
    ]
    out += [Content.assemble(f"  {place.share * 100:>3.0f}%   ", place.frame.text()) for place in frames.top]
    return Content("\n").join(out)


PHASES_FROM = {
    "ddp": "forward, backward and the exchange from DDP's own logger",
    "hooks": "forward and backward from the model's hooks, less the collectives' blocked time",
    "cuda events": "forward and backward from CUDA events at the model's hooks, less the compute stream's waits",
}


def _collectives_section(s: RankStats, rank: int, peers: Sequence[tuple[int, RankStats]]) -> Content | None:
    """Each kind of collective on each process group, a step: how many, how big, in flight, exposed, and how much
    of that exposed time this rank waited for the rank that reached it last ("last to arrive": this rank did)."""
    if not s.collectives:
        return None
    source = PHASES_FROM.get(s.phases.source or "", "")
    out = [
        Content.assemble(("collectives, a step", "bold $accent"), (f"   {source}" if source else "", "$text-muted")),
    ]
    header = (
        f"  {'collective':<16}{'group':<10}{'calls':>7}{'each':>11}{'in flight':>11}{'exposed':>10}{'bus bw':>11}"
        "  waiting for the last"
    )
    out.append(Content.styled(header, "$text-muted"))
    last = last_to_arrive(s.collectives, [(r, p.collectives) for r, p in peers])
    for c in s.collectives:
        found = last.get((c.kind, c.group))
        if found is None:
            waited = NA
        elif found[0] is None:
            waited = "- (they arrive together)"
        elif found[0] == rank:
            waited = "last to arrive"
        else:
            waited = f"{fmt_s(found[1])}, for rank {found[0]}"
        out.append(
            Content(
                f"  {c.kind:<16}{c.group[:9]:<10}{c.calls:>7.3g}{size_text(c.bytes_each):>11}"
                f"{fmt_s(c.busy_s):>11}{fmt_s(c.exposed_s):>10}{bus_text(c):>11}  {waited}"
            )
        )
    return Content("\n").join(out)


def bus_text(c: CollectiveFigures) -> str:
    bandwidth = c.bandwidth
    return NA if bandwidth is None else bandwidth_text(bandwidth[1])


def _section(title: str, lines: list[Line]) -> Content:
    out = [Content.styled(title, "bold $accent")]
    for label, value in lines:
        out.append(
            Content.assemble(
                f"  {label:<20} ",
                (value, "") if value is not None else (NA, "$text-muted"),
            )
        )
    return Content("\n").join(out)


def _title(rank: RankSnapshot, row: RankRow) -> Content:
    """Which rank of which run, on which GPU, and its status (and whether the straggler finding names it)."""
    status_style = {"live": "$success", "lost": "bold $error"}.get(row.status, "$text-muted")
    return Content.assemble(
        (f"{row.run_name}  rank {row.rank}", "bold"),
        f"  of {rank.hello.world_size}  ·  GPU {row.gpu}  ·  ",
        (row.status, status_style),
        (f" ({row.status_reason})" if row.status_reason else "", "$text-muted"),
        ("   ▲ slowest: named by the straggler finding" if row.slowest else "", "bold $error"),
    )


def _stats_text(s: RankStats, figures: RankFigures | None) -> Content:
    """The rank's figures over the span: step times, throughput, work, shares, memory, CPU and gputop's cost."""
    memory = (
        f"{fmt_bytes(s.memory.allocated_bytes)} alloc, {fmt_bytes(s.memory.reserved_bytes)} reserved, "
        f"{fmt_bytes(s.memory.peak_bytes)} peak, {s.memory.alloc_retries or 0} alloc retries"
    )
    return Content.assemble(
        ("step ", "$text-muted"),
        f"p50 {fmt_s(s.step.p50_s)}  p95 {fmt_s(s.step.p95_s)}  max {fmt_s(s.step.max_s)}",
        ("   GPU step ", "$text-muted"),
        fmt_s(s.step.gpu_p50_s),
        ("   throughput ", "$text-muted"),
        f"{fmt_rate(s.step.per_s)} steps/s, {fmt_rate(s.step.samples_per_s)} samples/s",
        ("\nwork a step ", "$text-muted"),
        _work_text(figures),
        ("\nloader wait ", "$text-muted"),
        fmt_frac(s.phases.loader_wait_frac),
        ("   exposed comm ", "$text-muted"),
        fmt_frac(s.phases.exposed_comm_frac),
        ("   memory ", "$text-muted"),
        memory if s.memory.allocated_bytes is not None else NA,
        ("   CPU ", "$text-muted"),
        f"{fmt_pct(s.cpu.pct)} + workers {fmt_pct(s.cpu.workers_pct)}",
        (f"   threads {s.cpu.threads}" if s.cpu.threads is not None else "", "$text-muted"),
        ("\ngputop's own cost ", "$text-muted"),
        _cost_text(s),
    )


def _na_section(na: dict[str, str]) -> Content | None:
    """Why each figure the rank does not measure is N/A; None when it measures them all."""
    if not na:
        return None
    return Content("\n").join(
        [Content.styled("not measured", "bold $accent")]
        + [Content.assemble("  ", (reason, "$text-muted")) for reason in na.values()]
    )


def _events_section(rank: RankSnapshot, now_t: float) -> Content:
    """The rank's last ten events, newest first."""
    events = [Content.styled("recent events", "bold $accent")]
    for event in rank.events[-10:][::-1]:
        ago = now_t - event.t
        events.append(Content.assemble(f"  {ago:>6.0f}s ago  ", (event.kind, "bold"), f"  {event.message}"))
    if len(events) == 1:
        events.append(Content.styled("  none", "$text-muted"))
    return Content("\n").join(events)


class RankDetailScreen(Screen[None]):
    """The rank ``key`` ("run_id:rank"); follows new snapshots while open; esc goes back."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("c", "capture(False)", "Profile rank"),
        Binding("C", "capture(True)", "Profile run"),
    ]

    def __init__(self, *, key: str, view: DashboardView) -> None:
        """Open on one rank.

        Args:
            key: The rank's row key, "run_id:rank".
            view: The dashboard's current view.
        """
        super().__init__()
        self.key = key
        self._view = view

    def compose(self) -> ComposeResult:
        yield Static(id="detail-title")
        with VerticalScroll(id="detail-body"):
            yield Static(id="detail-stats")
            yield PhaseBar(id="detail-phases")
            yield Static(id="detail-frames")
            yield Static(id="detail-collectives")
            yield HistoryPanel(id="detail-history")
            yield CapturePanel(id="detail-captures")
            yield Static(id="detail-na")
            yield Static(id="detail-facts")
            yield Static(id="detail-events")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(PhaseBar).border_title = "one step, by phase"
        self.query_one(HistoryPanel).border_title = "history"
        self._draw(self._view)  # is_mounted turns True only after this handler: show() would skip it

    def show(self, view: DashboardView) -> None:
        """Redraw from a newer view (the app calls this on every refresh while open)."""
        self._view = view
        if not self.is_mounted:  # a refresh between push_screen and mount: on_mount draws the newest view
            return
        # A refresh can land while the app exits and takes the screen's widgets down: nothing to draw on.
        with contextlib.suppress(NoMatches):
            self._draw(view)

    def _draw(self, view: DashboardView) -> None:
        rank, row = view.rank(self.key), view.row(self.key)
        title = self.query_one("#detail-title", Static)
        if rank is None or row is None:
            title.update(Content.styled(f"rank {self.key} is gone from the data", "bold $error"))
            return
        s = row.stats
        title.update(_title(rank, row))
        self.query_one("#detail-stats", Static).update(_stats_text(s, view.figures.rank(self.key)))
        self.query_one(PhaseBar).phases = tuple(phase_seconds(s.phases).items())
        self._show_if_any("#detail-frames", _frames_section(rank, view.snapshot.t))
        peers = [(r.rank, r.stats) for r in view.rank_rows if r.run_id == row.run_id]
        self._show_if_any("#detail-collectives", _collectives_section(s, row.rank, peers))
        run = next((r for r in view.snapshot.runs if r.run_id == rank.run_id), None)
        self.query_one(CapturePanel).show(run.ranks if run is not None else (rank,), view.snapshot.t)
        self.query_one(HistoryPanel).series = view.series(self.key)
        self._show_if_any("#detail-na", _na_section(row.na))
        sections = [_section(heading, lines) for heading, lines in _facts(rank.hello)]
        gpu = _gpu_section(view, self.key)
        self.query_one("#detail-facts", Static).update(Content("\n\n").join([gpu, *sections] if gpu else sections))
        self.query_one("#detail-events", Static).update(_events_section(rank, view.snapshot.t))

    def _show_if_any(self, selector: str, content: Content | None) -> None:
        """A section that is there only for some ranks: hidden when it has nothing to say."""
        static = self.query_one(selector, Static)
        static.display = content is not None
        static.update(content or "")

    def action_capture(self, whole_run: bool) -> None:
        """Profile this rank's next steps (or every rank's of its run, side by side)."""
        rank = self._view.rank(self.key)
        if rank is None:
            return
        run = next((r for r in self._view.snapshot.runs if r.run_id == rank.run_id), None)
        ranks = [r.rank for r in run.ranks if r.status == "live"] if (whole_run and run is not None) else [rank.rank]
        request_captures(self.app, rank.run_id, ranks or [rank.rank])
