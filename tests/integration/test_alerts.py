"""`record --on-finding` on a real 2-rank job: the command hears of a finding once, however long it lasts."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.support.collectors import wait_for
from tests.support.processes import LAUNCH_RANKS, free_port, needs_torch


@needs_torch
@pytest.mark.slow
def test_record_on_finding_runs_the_command_with_the_finding_on_stdin(tmp_path) -> None:
    """A real 2-rank job that waits for data: the command hears of it once, however long it lasts.

    A finished run keeps the diagnosis of its last span (the dashboard shows how
    it ended), so its findings do not clear; clearing is tested in tests/unit/test_alerts.py.
    """
    port = free_port()
    out = tmp_path / "alerts.jsonl"
    script = tmp_path / "hook.sh"
    script.write_text(f"#!/bin/sh\ncat >> {out}\n")
    script.chmod(0o755)
    record = subprocess.Popen(
        [sys.executable, "-m", "gputop", "record", "--port", str(port), "--seconds", "180",
         "-o", str(tmp_path / "run.jsonl"), "--on-finding", str(script), "--alert-after", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    job = subprocess.run(
        [sys.executable, str(LAUNCH_RANKS), "2", "-m", "gputop.demos.train",
         "--scenario", "slow_loader", "--seconds", "10"],
        env={**__import__("os").environ, "GPUTOP_PORT": str(port)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert job.returncode == 0, job.stdout[-2000:] + job.stderr[-2000:]
    # A finished run keeps its findings: the alert comes by now, or a few seconds later on a busy machine.
    wait_for(lambda: out.exists() and b'"raised"' in out.read_bytes(), timeout_s=60)
    time.sleep(5)  # and does not come again
    record.send_signal(signal.SIGINT)
    _, stderr = record.communicate(timeout=60)
    assert record.returncode == 0, stderr
    assert out.exists(), f"the command never ran; recorder said:\n{stderr}"
    events = [json.loads(line) for line in out.read_text().splitlines()]
    loader = [e for e in events if e["finding"]["cause"] == "data_loading"]
    seen = [e["event"] for e in loader]
    assert seen[0] == "raised" and seen.count("raised") == 1, f"alerts: {seen}; recorder said:\n{stderr}"
    assert "cleared" not in seen, seen
    raised = loader[0]
    assert raised["held_s"] >= 2 and raised["finding"]["severity"] in ("warn", "critical")
    assert raised["finding"]["evidence"] and raised["finding"]["suggestion"]
