"""`gputop mcp` as a coding agent meets it: the tools, their answers and errors, and a straggler named live.

The fast tests talk to the server in-process (the SDK's ``Client`` on an
``MCPServer``) over fixed data; the slow one launches ``gputop mcp --port P``
with the SDK's own stdio client while a real 2-rank DDP job reports to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import IO, Any

import psutil
import pytest
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult

from gputop.cli import main
from gputop.cli.mcp import INSTALL_HINT, report_of
from gputop.diagnose import Diagnoser
from gputop.diagnose.findings import CAUSES
from gputop.mcp import answers
from gputop.mcp.server import LiveFindings, build_server
from gputop.model.source import FixedSource
from tests.support import tui_fixtures
from tests.support.diagnose_fixtures import RankSpec, make_snapshot
from tests.support.processes import JOBS, LAUNCH_RANKS, free_port, needs_torch
from tests.support.recordings import write_run

TOOLS = {"list_runs", "get_findings", "get_rank", "get_recording_report", "capture_profile"}


def straggler_snapshot() -> Any:
    """Rank 1 waits 40% of its step for data; rank 0 waits for rank 1 in the all-reduce."""
    return make_snapshot(
        [
            RankSpec(rank=0, loader_frac=0.01, forward_frac=0.2, backward_frac=0.3, comm_frac=0.45, overlap_frac=0.05),
            RankSpec(rank=1, loader_frac=0.40, forward_frac=0.2, backward_frac=0.3, comm_frac=0.07, overlap_frac=0.05),
        ]
    )


@contextlib.asynccontextmanager
async def in_process(source: Any) -> AsyncIterator[Client]:
    """The server over ``source``, its findings shown at once (no 1-s persistence on fixed data)."""
    live = LiveFindings(source, refresh_s=0.05, diagnoser=Diagnoser(show_after_s=0.0))
    live.start()
    try:
        server = build_server(live, lambda path: report_of(path, None))
        async with Client(server) as client:
            yield client
    finally:
        live.stop()


def text_of(result: CallToolResult) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


class TestTools:
    """What an agent sees before calling anything: five tools, each saying what it answers."""

    async def test_the_tools_are_listed_with_descriptions_and_only_the_capture_has_an_effect(self) -> None:
        async with in_process(FixedSource(straggler_snapshot())) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(listed) == TOOLS
        for tool in listed.values():
            assert tool.description and len(tool.description) > 80, tool.name
            assert tool.annotations is not None
            assert tool.annotations.read_only_hint is (tool.name != "capture_profile"), tool.name
        assert "findings" in listed["get_findings"].description.lower()
        assert all(cause in (listed["get_findings"].description or "") for cause in CAUSES)  # recompile too
        assert listed["get_rank"].input_schema["required"] == ["rank"]
        steps = listed["capture_profile"].input_schema["properties"]["steps"]
        assert steps["maximum"] == answers.MAX_CAPTURE_STEPS


class TestAnswers:
    """Each tool's structured answer over a fixed straggler run."""

    async def test_get_findings_answers_with_the_findings_as_the_report_writes_them(self) -> None:
        async with in_process(FixedSource(straggler_snapshot())) as client:
            result = await client.call_tool("get_findings", {"run_id": "run"})
        assert not result.is_error, text_of(result)
        answer = result.structured_content
        assert answer is not None and answer["diagnosis"] == "ok"
        top = answer["findings"][0]
        assert top["cause"] == "straggler" and top["ranks"] == [1] and top["run_id"] == "run"
        for key in ("severity", "title", "evidence", "suggestion", "frames", "cost_ms_per_step", "speedup_x", "waste"):
            assert key in top, key
        assert top["evidence"] and all("text" in e for e in top["evidence"])
        assert top["cost_ms_per_step"] > 0 and top["waste"]["unit"] == "core"
        assert json.loads(text_of(result)) == answer  # the text block is the same JSON, for clients without structure

    async def test_list_runs_and_get_rank(self) -> None:
        async with in_process(FixedSource(straggler_snapshot())) as client:
            runs = (await client.call_tool("list_runs", {})).structured_content
            rank = await client.call_tool("get_rank", {"rank": 1, "history_windows": 5})
        assert runs is not None
        (run,) = runs["runs"]
        assert run["run_id"] == "run" and run["world_size"] == 2 and [r["rank"] for r in run["ranks"]] == [0, 1]
        assert run["findings"]["warn"] + run["findings"]["critical"] >= 1 and "rank 1" in run["worst_finding"]
        assert not rank.is_error, text_of(rank)
        figures = rank.structured_content
        assert figures is not None and figures["run_id"] == "run"
        assert figures["figures"]["rank"] == 1 and figures["figures"]["loader_wait_pct"] == pytest.approx(40, abs=1)
        assert len(figures["history"]["windows"]) == 5
        assert figures["history"]["windows"][-1]["step_ms"] == pytest.approx(100)
        assert [f["cause"] for f in figures["findings"]] == ["straggler"]

    async def test_get_rank_carries_each_collective_a_step(self) -> None:
        """An FSDP2 rank: its all-gathers and reduce-scatters on 'dp', with calls, bytes, in flight and exposed, and
        each call's bus bandwidth over the group's two ranks."""
        async with in_process(FixedSource(tui_fixtures.fsdp2_ranks())) as client:
            rank = await client.call_tool("get_rank", {"rank": 0, "run_id": "run-f"})
        assert not rank.is_error, text_of(rank)
        figures = rank.structured_content
        assert figures is not None and figures["figures"]["phases_from"] == "hooks"
        by_kind = {c["kind"]: c for c in figures["figures"]["collectives"]}
        gather = {"kind": "all_gather", "group": "dp", "calls_per_step": 7.0, "bytes_per_step": 665000}
        timed = {"in_flight_ms": 24.0, "exposed_ms": 21.0, "ranks": 2, "bus_bytes_per_s": 27_708_333}
        assert by_kind["all_gather"] == {**gather, **timed}  # bus: 2 x 95,000 B in 24/7 ms, x (2-1)/2
        assert by_kind["reduce_scatter"]["exposed_ms"] == pytest.approx(9.0)

    async def test_get_rank_carries_the_work_each_step_does(self) -> None:
        """FLOPs a step, FLOP/s achieved and MFU against the CPU's measured peak; N/A with the reason where not
        counted, for an agent to say why."""
        counted = [RankSpec(rank=r, flops_per_s=6e9, hello={"cpu_peak_flops": 100e9}) for r in (0, 1)]
        async with in_process(FixedSource(make_snapshot(counted))) as client:
            rank = await client.call_tool("get_rank", {"rank": 1})
        assert rank.structured_content is not None
        figures = rank.structured_content["figures"]
        assert figures["mfu_pct"] == pytest.approx(6.0) and figures["achieved_flops_per_s"] == pytest.approx(6e9)
        assert figures["flops_per_step"] == pytest.approx(6e8)
        async with in_process(FixedSource(make_snapshot([RankSpec(rank=0)]))) as client:
            uncounted = (await client.call_tool("get_rank", {"rank": 0})).structured_content
        assert uncounted is not None and uncounted["figures"]["mfu_pct"] is None
        assert uncounted["figures"]["work_note"], uncounted["figures"]

    async def test_the_recording_report_is_what_report_json_prints(self, tmp_path, capsys) -> None:
        path = tmp_path / "run.jsonl"
        write_run(path, windows=6)
        assert main(["report", str(path), "--format", "json"]) == 0
        printed = json.loads(capsys.readouterr().out)
        async with in_process(FixedSource(straggler_snapshot())) as client:
            result = await client.call_tool("get_recording_report", {"path": str(path)})
        assert not result.is_error, text_of(result)
        assert result.structured_content == printed


class TestBadArguments:
    """A wrong run, rank, path or step count is the tool's error in a sentence; the server answers on."""

    @pytest.mark.parametrize(
        ("tool", "arguments", "said"),
        [
            ("get_findings", {"run_id": "nope"}, "no run 'nope' reports to this collector; runs seen: 'run'"),
            ("get_rank", {"rank": 7}, "no run has a rank 7"),
            ("get_rank", {"rank": 7, "run_id": "run"}, "run 'run' has no rank 7; its ranks: 0, 1"),
            ("get_rank", {"rank": -1}, "greater than or equal to 0"),
            ("get_recording_report", {"path": "/nonexistent/run.jsonl"}, "cannot read /nonexistent/run.jsonl"),
            ("capture_profile", {"ranks": [0], "steps": 500}, "less than or equal to 20"),
            ("capture_profile", {"ranks": [0]}, "no ranks on the line"),  # a fixed source, like a replay
        ],
    )
    async def test_is_an_error_result_and_the_server_goes_on(self, tool: str, arguments: dict, said: str) -> None:
        async with in_process(FixedSource(straggler_snapshot())) as client:
            result = await client.call_tool(tool, arguments)
            assert result.is_error and said in text_of(result), text_of(result)
            assert not (await client.call_tool("list_runs", {})).is_error

    def test_a_run_is_profiled_at_most_once_per_interval(self) -> None:
        budget = answers.CaptureBudget(every_s=300.0)
        budget.take("run", 1000.0)
        budget.take("other", 1001.0)  # per run
        with pytest.raises(answers.BadArgument, match=r"profiled 60 s ago.*ask again in 240 s"):
            budget.take("run", 1060.0)
        assert budget.next_in_s("run", 1060.0) == 240.0
        budget.take("run", 1300.0)


def test_without_the_sdk_it_says_how_to_install_it_in_one_line() -> None:
    code = "import sys; sys.modules['mcp'] = None; from gputop.cli import main; sys.exit(main(['mcp', '--port', '1']))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"gputop: {INSTALL_HINT}"
    assert "pip install 'gputop-train[mcp]'" in INSTALL_HINT
    assert result.stdout == ""


def test_a_client_that_closes_stdin_ends_the_server_which_wrote_nothing_but_to_stderr() -> None:
    """stdout is the protocol's: with no request there is nothing on it; the collector's line goes to stderr."""
    cmd = [sys.executable, "-m", "gputop", "mcp", "--port", str(free_port())]
    # Not niced (what it is not testing): at nice 10 on 2 busy cores its exit alone took 15 s.
    env = {**os.environ, "GPUTOP_NICE": "0"}
    result = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert "gputop: answering MCP on stdio; ranks report to tcp://127.0.0.1:" in result.stderr


def test_sigterm_ends_the_server_while_its_client_still_holds_stdin() -> None:
    """A supervisor's `kill` while the agent keeps the pipe open: the server leaves, it does not wait on stdin."""
    cmd = [sys.executable, "-m", "gputop", "mcp", "--port", str(free_port())]
    env = {**os.environ, "GPUTOP_NICE": "0"}
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 60
        assert proc.stderr is not None
        said = b""
        while b"answering MCP on stdio" not in said and time.monotonic() < deadline:
            said += proc.stderr.readline()
        assert b"answering MCP on stdio" in said, said
        assert proc.stdin is not None and proc.stdout is not None
        client = {"name": "t", "version": "1"}
        params = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client}
        hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": params}
        proc.stdin.write((json.dumps(hello) + "\n").encode())
        proc.stdin.flush()
        assert b'"id":1' in proc.stdout.readline()  # a session under way: the SDK's reader waits on stdin
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0  # it stayed alive until the client closed stdin
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_mcp_server_never_imports_torch() -> None:
    code = "import gputop.mcp.server, gputop.cli.mcp, sys; print(sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert "'torch'" not in loaded.stdout and "'textual'" not in loaded.stdout


# -- the real thing: the SDK's stdio client, `gputop mcp`, and a DDP job with a straggler ------------------

# Rank 1 computes a 30-ms Python metric after each optimizer step (a few ms of model work): rank 0 waits for it in
# the all-reduce most of each step, far past the 10% line (tests/unit/test_recorded_verdicts.py reads a recording).
STRAGGLER_JOB = ("--steps", "1000000", "--batch-size", "256", "--hidden", "1024", "--metric-ms", "30")
# The job's start (torch's import on 2 busy cores), the straggler rule's 20-s live warm-up, then the span: ~40 s.
FINDING_DEADLINE_S = 180.0


@contextlib.contextmanager
def job_tree(*args: str, port: int, log: IO[bytes], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """A 2-rank job in its own session, output to ``log`` (no pipe to hold open); on the way out, every process
    of it is gone: its launcher is asked to stop its ranks, then whatever is left of the tree is killed."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPUTOP_PORT": str(port), **env}
    full_env.pop("GPUTOP_SOCKET", None)
    cmd = [sys.executable, str(LAUNCH_RANKS), "2", str(JOBS / "ddp_job.py"), *args]  # fmt: skip
    proc = subprocess.Popen(cmd, env=full_env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    tree: dict[int, psutil.Process] = {}
    try:
        yield proc
    finally:
        with contextlib.suppress(psutil.Error):
            tree = {p.pid: p for p in psutil.Process(proc.pid).children(recursive=True)}
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        for child in tree.values():
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(list(tree.values()), timeout=15)


async def call(session: ClientSession, tool: str, arguments: dict[str, Any] | None = None) -> CallToolResult:
    return await session.call_tool(tool, arguments or {})


@needs_torch
@pytest.mark.slow
@pytest.mark.alone
async def test_a_live_straggler_is_named_by_get_findings_over_stdio(tmp_path: Path) -> None:
    """The SDK's stdio client starts `gputop mcp --port P`; a 2-rank job whose rank 1 is slow reports to it.

    get_findings names rank 1 as a straggler within the deadline, with its evidence and fix; get_rank and
    list_runs agree; an unknown rank is an error result; and one capture of both ranks comes back with
    traces while a second at once is refused by the per-run limit.
    """
    import anyio

    port = free_port()
    server_log_path, job_log_path = tmp_path / "gputop-mcp.log", tmp_path / "job.log"
    params = StdioServerParameters(command=sys.executable, args=["-m", "gputop", "mcp", "--port", str(port)],
                                   cwd=str(Path(__file__).parent.parent))  # fmt: skip
    seen: list[str] = []

    def what_it_saw() -> str:
        server_log = server_log_path.read_text(errors="replace")[-3000:]
        job_log = job_log_path.read_text(errors="replace")[-3000:] if job_log_path.exists() else ""
        return "\n".join([*seen[-3:], f"--- gputop mcp's stderr:\n{server_log}", f"--- the job's output:\n{job_log}"])

    with open(server_log_path, "w") as server_log, open(job_log_path, "wb") as job_log:
        async with stdio_client(params, errlog=server_log) as (read, write), ClientSession(read, write) as session:
            with anyio.fail_after(60):
                await session.initialize()  # answered once the collector listens: the job may start
            with job_tree(*STRAGGLER_JOB, port=port, log=job_log, env={"GPUTOP_TRACE_DIR": str(tmp_path)}):
                straggler = None
                deadline = time.monotonic() + FINDING_DEADLINE_S
                while straggler is None and time.monotonic() < deadline:
                    await anyio.sleep(1.0)
                    result = await call(session, "get_findings")
                    assert not result.is_error, text_of(result)
                    answer = result.structured_content or {}
                    found = answer.get("findings", [])
                    said = [f"[{f['severity']}] {f['cause']} {f['ranks']}: {f['title']}" for f in found]
                    seen.append(" | ".join(said) or json.dumps(answer)[:300])
                    warned = [f for f in found if f["severity"] in ("warn", "critical")]
                    straggler = next((f for f in warned if f["cause"] == "straggler"), None)
                assert straggler is not None, f"no straggler in {FINDING_DEADLINE_S:.0f} s; saw:\n{what_it_saw()}"
                assert straggler["ranks"] == [1], what_it_saw()
                assert straggler["evidence"] and straggler["suggestion"], straggler
                run_id = straggler["run_id"]

                runs = (await call(session, "list_runs")).structured_content or {}
                assert [r["run_id"] for r in runs["runs"]] == [run_id], runs
                assert [r["rank"] for r in runs["runs"][0]["ranks"]] == [0, 1], runs
                rank = await call(session, "get_rank", {"run_id": run_id, "rank": 1})
                assert not rank.is_error, text_of(rank)
                assert rank.structured_content and rank.structured_content["history"]["windows"], rank
                assert "straggler" in [f["cause"] for f in rank.structured_content["findings"]]
                missing = await call(session, "get_rank", {"run_id": run_id, "rank": 5})
                assert missing.is_error and f"run '{run_id}' has no rank 5; its ranks: 0, 1" in text_of(missing)

                captured = await call(session, "capture_profile", {"run_id": run_id, "ranks": [0, 1], "steps": 2})
                assert not captured.is_error, f"{text_of(captured)}\n{what_it_saw()}"
                results = (captured.structured_content or {})["results"]
                assert [(r["rank"], r["ok"], r["steps"]) for r in results] == [(0, True, 2), (1, True, 2)], results
                assert all(Path(r["trace_path"]).is_file() for r in results), results
                again = await call(session, "capture_profile", {"run_id": run_id, "ranks": [1], "steps": 2})
                assert again.is_error and "at most once every 300 s" in text_of(again), text_of(again)
