"""Profiler captures in the rank detail screen: the key that asks for one, and the panel that shows them.

``c`` profiles the open rank's next steps, ``C`` every rank of its run at once
(so they profile the same steps); each rank's latest capture is shown side by
side: the ten operators with the most self time, per step on each rank, and
where each trace file is.  Asking needs a live source (a replay cannot
profile anything); the answer, or why there is none, comes as a notification.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import os
import time
from collections.abc import Sequence

from textual.app import App
from textual.content import Content
from textual.widgets import Static

from gputop.model.captures import compare
from gputop.model.snapshot import RankSnapshot
from gputop.model.source import TalksToRanks
from gputop.protocol import CaptureRequest, CaptureResult

CAPTURE_STEPS = 5  # a few steps: enough for the operators' shares, a trace small enough to open
_ids = itertools.count(1)


def request_captures(app: App[int], run_id: str, ranks: Sequence[int], steps: int = CAPTURE_STEPS) -> None:
    """Ask the source to have each rank profile its next ``steps`` steps; notify with each answer."""
    source = getattr(app, "source", None)  # the dashboard's; a bare App in a test has none
    if not isinstance(source, TalksToRanks):
        app.notify("profiling needs a live dashboard: a replay has no ranks to ask", severity="warning")
        return
    names = ", ".join(map(str, ranks))
    app.notify(f"profiling the next {steps} steps of rank{'s' if len(ranks) > 1 else ''} {names}…", timeout=5)
    for rank in ranks:
        request = CaptureRequest(run_id=run_id, rank=rank, id=f"tui-{os.getpid()}-{next(_ids)}", steps=steps)
        future: concurrent.futures.Future[CaptureResult] = source.request_capture(request)
        future.add_done_callback(functools.partial(_on_thread_answered, app, rank))


def _on_thread_answered(app: App[int], rank: int, done: concurrent.futures.Future[CaptureResult]) -> None:
    # Runs on the collector's thread (or at once, for an answer that was ready).
    if app.is_running:  # posted to the app's queue from any thread, without waiting (see news._on_profile_answered)
        app.call_later(_answered, app, rank, done)


def _answered(app: App[int], rank: int, done: concurrent.futures.Future[CaptureResult]) -> None:
    try:
        result = done.result()
    except Exception as exc:  # the relay itself broke: say so, the dashboard goes on
        app.notify(f"rank {rank}: {type(exc).__name__}: {exc}", title="capture failed", severity="error")
        return
    if result.ok:
        app.notify(f"rank {rank}: trace {result.trace_path}", title="capture done", timeout=10)
    else:
        app.notify(f"rank {rank}: {result.error}", title="capture failed", severity="error", timeout=15)


class CapturePanel(Static):
    """The latest capture of each rank of one run, side by side."""

    def show(self, ranks: Sequence[RankSnapshot], now_t: float | None = None) -> None:
        """Redraw from the run's ranks (each carries the captures it answered)."""
        latest = [rank.captures[-1] for rank in ranks if rank.captures]
        self.display = bool(latest)
        if not latest:
            return
        now_t = time.time() if now_t is None else now_t
        lines = [Content.styled("profiler captures (c: this rank, C: every rank)", "bold $accent")]
        header, rows = compare(latest)
        if rows:
            widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
            lines.append(Content.styled("  " + _row(header, widths), "$text-muted"))
            lines += [Content("  " + _row(row, widths)) for row in rows]
        for result in sorted(latest, key=lambda r: r.rank):
            ago = f"{max(now_t - result.t, 0):.0f}s ago"
            if result.ok:
                lines.append(Content.assemble(f"  rank {result.rank} ({ago}, {result.steps} steps): ",
                                              (result.trace_path, "$text-muted")))  # fmt: skip
            else:
                lines.append(Content.assemble(f"  rank {result.rank} ({ago}): ", (result.error, "$error")))
        self.update(Content("\n").join(lines))


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(cells))
