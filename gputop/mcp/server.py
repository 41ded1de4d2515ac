"""The MCP server: gputop's tools on the official ``mcp`` SDK, over stdio.

The live chain (``RefreshPipeline``: figures over the dashboard's span, findings
with its persistence, the briefs the ranks are told) runs on a thread of its
own once a second, as ``gputop record --on-finding`` runs it; a tool reads its
newest result, so an agent sees the findings the dashboard would show, and a
finding has held as long as it has on the dashboard however seldom the agent
asks.  The tools are plain functions the SDK runs on worker threads; the one
with an effect, the capture, goes down the collector's existing channel and
is bounded by ``answers.CaptureBudget``.

stdout is the protocol: the SDK points fd 1 at stderr while it serves, so a
stray print lands in the log, not in the stream, and gputop's own lines go to
stderr through logging.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from gputop import __version__
from gputop.diagnose import Diagnoser
from gputop.diagnose.findings import CAUSES
from gputop.diagnose.pipeline import Refresh, RefreshPipeline
from gputop.mcp import answers
from gputop.model.snapshot import SNAPSHOT_HISTORY_WINDOWS
from gputop.model.source import SnapshotSource, TalksToRanks
from gputop.protocol import CaptureRequest, CaptureResult

log = logging.getLogger("gputop.mcp")

T = TypeVar("T")

REFRESH_S = 1.0  # as `gputop record --on-finding`: findings show after firing for 1 s, so 2 refreshes
FIRST_UPDATE_WAIT_S = 10.0  # a tool called before the first refresh waits this long for it

INSTRUCTIONS = """\
gputop watches PyTorch training runs live (each rank reports to this server) and says in plain words why \
their GPUs (or CPUs) sit idle: data loading, a straggler rank, exposed communication, stalls, hangs, \
settings, memory, allocation. Start with list_runs; get_findings gives each cause at work with the numbers \
that show it, where the ranks' training threads were (file:line), what fixing it is worth (ms per step, \
speedup, GPU-hours wasted) and the change to make in the training script. get_rank gives one rank's \
figures and recent history; get_recording_report reads a file written by `gputop record`; capture_profile \
runs torch.profiler on ranks for a few steps (rate-limited). Figures cover the last 10 s of the run."""

# A recording's path to its report (``gputop report --format json``'s data); answers.BadArgument when the file
# is not a readable recording.  Handed in by the CLI, which owns reading files into a store.
ReportReader = Callable[[Path], dict[str, Any]]

RunId = Annotated[
    str | None,
    Field(description="the run's id as list_runs gives it; omit it for every run (or the newest run with the rank)"),
]


class LiveFindings:
    """The live chain on a thread: every ``refresh_s`` a snapshot in, the newest ``Refresh`` kept."""

    def __init__(
        self, source: SnapshotSource, *, refresh_s: float = REFRESH_S, diagnoser: Diagnoser | None = None
    ) -> None:
        """``diagnoser``: the dashboard's persistence by default (a finding shows once it has held 1 s)."""
        self.source = source
        self.refresh_s = refresh_s
        self._pipeline = RefreshPipeline(diagnoser=diagnoser if diagnoser is not None else Diagnoser())
        self._latest: Refresh | None = None
        self._first = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gputop-mcp-findings", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    def latest(self) -> Refresh:
        """The newest refresh (waiting for the first); a ToolError if there has been none."""
        if not self._first.wait(FIRST_UPDATE_WAIT_S) or self._latest is None:
            raise ToolError("gputop has not read the collector yet: try again in a second")
        return self._latest

    def _run(self) -> None:
        said = "ok"
        while not self._stop.is_set():
            try:
                update = self._pipeline.update(self.source.snapshot())
            except Exception:  # a bug in the figures must not end the answers: said, and tried again
                log.exception("reading the collector failed")
            else:
                self._latest = update
                self._first.set()
                if update.diagnosis != said:  # a rule that raised: said once, not every second
                    said = update.diagnosis
                    log.warning("diagnosis %s", said)
                if isinstance(self.source, TalksToRanks):  # the ranks log the findings, as under the dashboard
                    for run_id, briefs in update.to_ranks.items():
                        self.source.notify_findings(run_id, briefs)
            self._stop.wait(self.refresh_s)


READING = ToolAnnotations(read_only_hint=True, open_world_hint=False)


def build_server(live: LiveFindings, read_report: ReportReader, *, price_per_hour: float | None = None) -> MCPServer:
    """The MCP server with gputop's tools over ``live``'s source; ``read_report`` answers get_recording_report."""
    server: MCPServer = MCPServer(name="gputop", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")
    _add_live_tools(server, live, price_per_hour)
    _add_report_tool(server, read_report)
    _add_capture_tool(server, live)
    return server


def checked(answer: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``answer(...)``, with a bad argument's sentence as the tool's error."""
    try:
        return answer(*args, **kwargs)
    except answers.BadArgument as exc:
        raise ToolError(str(exc)) from None


def _add_live_tools(server: MCPServer, live: LiveFindings, price_per_hour: float | None) -> None:
    """The tools that read the live chain's newest result: the runs, their findings, one rank."""

    @server.tool(
        name="list_runs",
        description="List the PyTorch training runs reporting to gputop now: each run's id, name, world size, "
        "its ranks (status, host, pid, device, steps, median step time, samples/s) and how many findings of "
        "each severity it has, with the worst one's title. Call this first to get the run ids.",
        annotations=READING,
    )
    def list_runs() -> dict[str, Any]:
        return answers.runs(live.latest())

    @server.tool(
        name="get_findings",
        description="The findings for a run, worst first: why its GPUs (or CPUs) sit idle now. Each finding has "
        f"its cause ({', '.join(CAUSES)}), severity, the ranks it is about, evidence (each number with the threshold "
        "it crossed), frames (where the named ranks' training threads were: function, file, line), cost "
        "(cost_ms_per_step, speedup_x, and waste in GPU-hours or core-hours) and suggestion: the fix to make.",
        annotations=READING,
    )
    def get_findings(run_id: RunId = None) -> dict[str, Any]:
        return checked(answers.findings, live.latest(), run_id, price_per_hour)

    @server.tool(
        name="get_rank",
        description="One rank's figures over the last 10 s: step time (p50/p95/max), loader wait, forward, "
        "backward, exposed communication, memory peak, CPU and CPU wait, DataLoader workers, where its training "
        "thread is (frames), its GPU, the findings that name it, its recent history window by window (step "
        "time, loader wait %, exposed comm %; newest last) and its last profiler captures.",
        annotations=READING,
    )
    def get_rank(
        rank: Annotated[int, Field(ge=0, description="the rank number (0 .. world size - 1)")],
        run_id: RunId = None,
        history_windows: Annotated[
            int, Field(ge=1, le=SNAPSHOT_HISTORY_WINDOWS, description="how many of its newest windows to return")
        ] = answers.HISTORY_WINDOWS,
    ) -> dict[str, Any]:
        update = live.latest()
        figures = checked(answers.rank_of, update.figures, run_id, rank)
        source = live.source
        source.focus = frozenset({figures.key})  # as the dashboard's selected rank: its whole history is copied
        history = next((r for r in source.snapshot().all_ranks() if r.key == figures.key), None)
        return answers.rank(update, figures, history=history, points=history_windows, price_per_hour=price_per_hour)


def _add_report_tool(server: MCPServer, read_report: ReportReader) -> None:
    @server.tool(
        name="get_recording_report",
        description="The report of a recording written by `gputop record` (a .jsonl or .jsonl.gz path on this "
        "machine, relative to where gputop mcp runs): per run and rank the figures over the whole recording, "
        "the GPUs, and the findings with evidence, frames, cost and fix; the same content as "
        "`gputop report FILE --format json`.",
        annotations=READING,
    )
    def get_recording_report(
        path: Annotated[str, Field(description="the recording's path, e.g. run.jsonl")],
    ) -> dict[str, Any]:
        return checked(read_report, Path(path).expanduser())


def _add_capture_tool(server: MCPServer, live: LiveFindings) -> None:
    """The one tool with an effect on the run, bounded by a capture budget per run."""
    budget = answers.CaptureBudget()
    budget_lock = threading.Lock()
    captures = itertools.count(1)

    @server.tool(
        name="capture_profile",
        description="Profile ranks' next few training steps with torch.profiler, all at once, and return each "
        "rank's busiest operators (ms per step, side by side) and the path of its Chrome/Perfetto trace. The "
        f"one tool with an effect on the run: at most {answers.MAX_CAPTURE_STEPS} steps, and at most one "
        f"capture per run every {answers.CAPTURE_EVERY_S:.0f} s (a refusal says when to ask again). Profile "
        "the rank a straggler finding names beside one that is not.",
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
        ),
    )
    def capture_profile(
        ranks: Annotated[list[int], Field(min_length=1, max_length=64, description="the ranks, e.g. [0, 1]")],
        run_id: RunId = None,
        steps: Annotated[int, Field(ge=1, le=answers.MAX_CAPTURE_STEPS, description="steps to profile")] = 5,
        timeout_s: Annotated[
            float, Field(gt=0, le=answers.MAX_CAPTURE_WAIT_S, description="how long to wait for the ranks")
        ] = 60.0,
    ) -> dict[str, Any]:
        source = live.source
        if not isinstance(source, TalksToRanks):
            raise ToolError("this source has no ranks on the line to ask")
        run = checked(answers.capturable, live.latest(), run_id, list(dict.fromkeys(ranks)), steps)
        with budget_lock:
            checked(budget.take, run.run_id, time.monotonic())
        tag = f"mcp-{os.getpid()}-{next(captures)}"  # names the trace files, unique among this server's asks
        futures = [
            source.request_capture(
                CaptureRequest(run_id=run.run_id, rank=r, id=f"{tag}-r{r}", steps=steps, timeout_s=timeout_s)
            )
            for r in dict.fromkeys(ranks)
        ]
        results: list[CaptureResult] = []
        for future in futures:  # the collector answers a rank's timeout itself; the grace is for a stuck loop
            try:
                results.append(future.result(timeout=timeout_s + 10.0))
            except concurrent.futures.TimeoutError:
                raise ToolError(f"the collector gave no answer in {timeout_s + 10.0:.0f} s") from None
        answer = answers.capture(results)
        answer["run_id"] = run.run_id
        answer["next_capture_in_s"] = round(budget.next_in_s(run.run_id, time.monotonic()))
        return answer


def serve(
    source: SnapshotSource,
    read_report: ReportReader,
    *,
    price_per_hour: float | None = None,
    refresh_s: float = REFRESH_S,
) -> None:
    """Answer an MCP client on stdin/stdout until it closes them; the caller owns the source's start and stop.

    The protocol's event loop runs in a thread of its own and this one only waits for it, so a KeyboardInterrupt
    (Ctrl-C, or SIGTERM made one) lands here and ends ``serve`` at once. Raised inside the loop it could land in
    one of the SDK's tasks, whose task group then cancels the others and waits for its stdin reader: a blocking
    read in a worker thread that nothing cancels while the client holds the pipe open, so the server never left
    (one SIGTERM in ~50 in the suite). The caller leaves with ``os._exit`` after its own cleanup, that reader
    still blocked.
    """
    live = LiveFindings(source, refresh_s=refresh_s)
    live.start()
    ended: list[BaseException] = []

    def answer() -> None:
        try:
            anyio.run(build_server(live, read_report, price_per_hour=price_per_hour).run_stdio_async)
        except BaseException as exc:  # said by the waiting thread, which owns the exit
            ended.append(exc)

    protocol = threading.Thread(target=answer, name="gputop-mcp-stdio", daemon=True)
    try:
        protocol.start()
        protocol.join()
    finally:
        live.stop()
    if ended:
        raise ended[0]
