"""The gputop command as a user runs it: outputs, one-line errors, exit codes."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys

import pytest

from gputop import cli
from tests.support.processes import exited_pid, gputop
from tests.support.recordings import write_run


@pytest.fixture
def recording_file(tmp_path):
    path = tmp_path / "run.jsonl"
    write_run(path, windows=6)
    return path


def test_report_json_has_the_documented_shape(recording_file) -> None:
    result = gputop("report", str(recording_file), "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    (run,) = report["runs"]
    assert run["run_id"] == "r" and run["world_size"] == 1
    (rank,) = run["ranks"]
    for key in ("rank", "steps", "step_time_p50_ms", "step_time_p95_ms", "samples_per_s", "loader_wait_pct",
                "comm_exposed_pct", "mem_peak_bytes", "lost"):  # fmt: skip
        assert key in rank
    assert rank["steps"] == 12 and rank["lost"] is False
    assert rank["comm_exposed_pct"] is None  # not measured is null, never 0
    assert isinstance(report["findings"], list)
    assert report["gpus"]["unavailable"] == "NVML library not found"


@pytest.mark.parametrize(("fmt", "marker"), [("text", "Findings:"), ("markdown", "# gputop report")])
def test_report_text_and_markdown(recording_file, fmt: str, marker: str) -> None:
    result = gputop("report", str(recording_file), "--format", fmt)
    assert result.returncode == 0
    assert marker in result.stdout and "N/A" in result.stdout


def test_output_piped_into_head_ends_without_a_traceback() -> None:
    """`gputop doctor | head -1`: doctor prints line by line (torch's import takes seconds), so later lines
    meet a closed pipe. That is the reader having had enough: exit 141 like `yes | head`, no traceback."""
    pipeline = f"{sys.executable} -m gputop doctor | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}"
    result = subprocess.run(["bash", "-c", pipeline], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in result.stderr and "BrokenPipe" not in result.stderr, result.stderr
    assert result.stdout.strip() == "141"


def test_report_of_a_file_that_is_not_a_recording_is_one_line(tmp_path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    for command in ("report", "replay"):
        result = gputop(command, str(path))
        assert result.returncode == 1
        assert result.stderr.strip().splitlines() == [
            f"gputop: {path} is not a gputop recording (make one with `gputop record`)"
        ]


def test_usage_errors_exit_2() -> None:
    assert gputop("record", "--seconds", "-1", "-o", "x.jsonl").returncode == 2
    assert gputop("report").returncode == 2
    assert gputop("demo", "--scenario", "nope").returncode == 2


def test_record_on_a_port_in_use_is_one_line(tmp_path) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    result = gputop("record", "--port", str(busy.getsockname()[1]), "--seconds", "1", "-o", str(tmp_path / "r.jsonl"))
    busy.close()
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "cannot listen" in result.stderr


def test_demo_without_torch_is_one_line(monkeypatch, capsys) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert cli.main(["demo", "--headless", "--seconds", "1"]) == 1
    assert capsys.readouterr().err.strip() == (
        "gputop: `gputop demo` runs a real PyTorch job and needs torch: pip install 'gputop-train[torch]'"
    )


def test_a_demo_rank_whose_demo_is_gone_does_not_start() -> None:
    """A rank that starts after its demo died leaves before it joins the job."""
    from gputop.demos.teardown import DEMO_PID_ENV, leave_with_the_demo

    assert leave_with_the_demo({DEMO_PID_ENV: str(exited_pid())}) is False
    assert leave_with_the_demo({}) is True  # started by hand: tied to nothing
