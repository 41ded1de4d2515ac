"""Profiler capture on demand: a real 2-rank job profiles its next steps when asked, from the CLI or the dashboard."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputop.address import Address
from gputop.collect.capture_relay import ask
from gputop.collect.live import LiveSource
from gputop.protocol import CaptureRequest
from gputop.tui.app import GputopApp
from gputop.tui.screens.detail import RankDetailScreen
from gputop.tui.widgets.captures import CapturePanel
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import finish, launch, needs_torch

# ~25 steps a second per rank on 2 shared cores: long enough to be asked, stopped by the test.
ENDLESS = ("--steps", "1000000", "--delay-ms", "10")


@pytest.fixture
def endless_job(collector, tmp_path) -> Iterator[subprocess.Popen[str]]:
    job = launch("ddp_job.py", *ENDLESS, port=collector.address.port, env={"GPUTOP_TRACE_DIR": str(tmp_path)})
    try:
        assert wait_for(lambda: _live_ranks(collector) == 2, timeout_s=90), "the job never reported 2 live ranks"
        yield job
    finally:
        job.terminate()
        try:
            job.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            job.kill()
            job.communicate()


def _live_ranks(collector) -> int:
    return sum(1 for v in snapshot_of(collector).all_ranks() if v.status == "live" and v.windows)


def _check_trace(path: str) -> None:
    """A Chrome/Perfetto trace: JSON with traceEvents, among them the step's CPU operators."""
    trace = json.loads(Path(path).read_text())
    names = {e.get("name", "") for e in trace["traceEvents"] if e.get("cat") == "cpu_op"}
    assert any(n.startswith("aten::") for n in names), sorted(names)[:20]
    assert path.endswith(".pt.trace.json")  # what TensorBoard's profiler plugin and HTA look for


@needs_torch
@pytest.mark.slow
def test_headless_capture_of_two_ranks_side_by_side(collector, endless_job) -> None:
    port = str(collector.address.port)
    cmd = [sys.executable, "-m", "gputop", "capture", "--port", port, "--rank", "0,1", "--steps", "3"]
    result = subprocess.run([*cmd, "--format", "json"], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    answers = json.loads(result.stdout)
    assert [a["rank"] for a in answers] == [0, 1] and all(a["ok"] and a["steps"] == 3 for a in answers)
    for answer in answers:
        _check_trace(answer["trace_path"])
        cpu_ops = sorted(answer["top_ops"], key=lambda o: -o["self_cpu_s"])
        assert 0 < len(cpu_ops) <= 10 and cpu_ops[0]["self_cpu_s"] > 0
    # DDP's gradient exchange is among the operators each rank spent its steps in.
    assert all(any("allreduce" in o["name"] for o in a["top_ops"]) for a in answers), answers
    # The dashboard side kept them too (the detail screen reads them from the store).
    assert wait_for(lambda: all(v.captures for v in snapshot_of(collector).all_ranks()))
    # Text: one table with a column per rank, then each rank's trace.
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert "r0 CPU ms/step" in lines[0] and "r1 CPU ms/step" in lines[0]
    assert sum(1 for line in lines if line.startswith("rank ") and ".pt.trace.json" in line) == 2


@needs_torch
@pytest.mark.slow
def test_a_rank_that_is_not_there_is_one_line_and_exit_1(collector) -> None:
    answer = ask(collector.address, CaptureRequest(rank=3, id="nobody", steps=2, timeout_s=5))
    assert not answer.ok and "no rank 3 is reporting" in answer.error
    cmd = [sys.executable, "-m", "gputop", "capture", "--port", "1", "--rank", "0"]
    nothing = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert nothing.returncode == 1 and "nothing listens on" in nothing.stderr


@needs_torch
@pytest.mark.slow
def test_a_failing_capture_says_why_and_training_goes_on(collector, tmp_path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    steps = 300
    job = launch("ddp_job.py", "--steps", str(steps), "--delay-ms", "10", port=collector.address.port,
                   env={"GPUTOP_TRACE_DIR": str(not_a_folder)})  # fmt: skip
    try:
        assert wait_for(lambda: _live_ranks(collector) == 2, timeout_s=90)
        answer = ask(collector.address, CaptureRequest(rank=1, id="fails", steps=2, timeout_s=60))
    finally:
        out = finish(job)
    assert not answer.ok and "writing the trace failed" in answer.error, answer
    assert f"rank 1 steps {steps}" in out and f"rank 0 steps {steps}" in out  # every step ran


@needs_torch
@pytest.mark.slow
async def test_the_detail_screen_profiles_every_rank_and_shows_the_top_operators(tmp_path) -> None:
    source = LiveSource(Address(port=0), sample_interval_s=1.0)
    source.start()
    job = launch("ddp_job.py", *ENDLESS, port=source.address.port, env={"GPUTOP_TRACE_DIR": str(tmp_path)})
    try:
        app = GputopApp(source, refresh_s=0.2)
        async with app.run_test(size=(140, 60)) as pilot:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not (app.view and len(app.view.rank_rows) == 2):
                await pilot.pause(0.2)
            assert app.view is not None and len(app.view.rank_rows) == 2, "the job never reported"
            await pilot.press("enter")
            assert isinstance(app.screen, RankDetailScreen)
            await pilot.press("C")  # every rank of the run, at once
            panel = app.screen.query_one(CapturePanel)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and str(panel.render()).count(".pt.trace.json") < 2:
                await pilot.pause(0.2)
            text = str(panel.render())
            assert "r0 CPU ms/step" in text and "r1 CPU ms/step" in text, text
            assert "aten::" in text or "allreduce" in text, text
            assert "capture done" in [n.title for n in app._notifications]
        traces = sorted(tmp_path.glob("*.pt.trace.json"))
        assert len(traces) == 2
        for trace in traces:
            _check_trace(str(trace))
    finally:
        job.terminate()
        job.communicate(timeout=30)
        source.stop()
