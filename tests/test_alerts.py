"""Alerts: a finding that holds rings once, again when it worsens or clears, never in a storm."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time

import pytest

from gputop.diagnose.alerts import AlertTracker
from gputop.diagnose.findings import Evidence, Finding
from gputop.model.source import FixedSource
from gputop.tui.app import GputopApp
from tests import tui_fixtures as fx
from tests.conftest import free_port, needs_torch, wait_for
from tests.test_tui import FAST_S, FakeDiagnoser, shown

LOADER = Finding(
    cause="data_loading",
    severity="warn",
    title="ranks wait for data 42% of each step",
    suggestion="DataLoader(num_workers=8)",
    evidence=(Evidence("loader_wait_pct", 42.0, 5.0, "%"),),
    ranks=(0, 1),
    run_id="r",
)
CRITICAL = dataclasses.replace(LOADER, severity="critical")
INFO = dataclasses.replace(LOADER, cause="model_config", severity="info")


def kinds(tracker: AlertTracker, findings: list[Finding], t: float) -> list[str]:
    return [f"{a.kind}:{a.finding.severity}" for a in tracker.update(findings, t)]


def test_a_finding_alerts_once_it_has_held_then_when_it_worsens_and_clears() -> None:
    tracker = AlertTracker(hold_s=30, min_interval_s=0)
    assert kinds(tracker, [LOADER, INFO], 0) == []
    assert kinds(tracker, [LOADER, INFO], 29) == []  # not held long enough yet
    assert kinds(tracker, [LOADER, INFO], 30) == ["raised:warn"]
    assert kinds(tracker, [LOADER, INFO], 60) == []  # once per finding, not every refresh
    assert kinds(tracker, [CRITICAL], 61) == ["worsened:critical"]
    assert kinds(tracker, [LOADER], 62) == []  # calming down is not news; clearing is
    alerts = tracker.update([], 70)
    assert [a.kind for a in alerts] == ["cleared"] and alerts[0].held_s == 70
    assert alerts[0].to_dict()["finding"]["cause"] == "data_loading"


def test_a_blip_shorter_than_the_hold_never_alerts_nor_clears() -> None:
    tracker = AlertTracker(hold_s=30)
    assert kinds(tracker, [LOADER], 0) + kinds(tracker, [], 10) + kinds(tracker, [LOADER], 20) == []
    assert kinds(tracker, [LOADER], 49) == []  # the hold starts again after a gap
    assert kinds(tracker, [LOADER], 50) == ["raised:warn"]


def test_a_flapping_finding_is_rate_limited() -> None:
    tracker = AlertTracker(hold_s=0, min_interval_s=300)
    assert kinds(tracker, [LOADER], 0) == ["raised:warn"]
    assert kinds(tracker, [], 10) == ["cleared:warn"]
    assert kinds(tracker, [LOADER], 20) == []  # back within 5 minutes: no second page
    assert kinds(tracker, [CRITICAL], 30) == []
    assert kinds(tracker, [CRITICAL], 300) == ["raised:critical"]


class TestDashboardAlerts:
    """The dashboard rings the terminal bell and shows a notification."""

    async def test_bell_and_notification_once_then_cleared(self) -> None:
        diagnoser = FakeDiagnoser([LOADER])
        snapshot = fx.two_ranks()
        source = FixedSource(snapshot)
        app = GputopApp(source, refresh_s=FAST_S, diagnoser_factory=lambda: diagnoser, alerts=AlertTracker(hold_s=0))
        bells: list[int] = []
        app.bell = lambda: bells.append(1)  # type: ignore[method-assign]
        async with app.run_test(size=(120, 40)) as pilot:
            await shown(pilot)
            for _ in range(5):
                await pilot.pause(FAST_S)
            assert bells == [1]
            titles = [n.title for n in app._notifications]
            assert titles.count("warn: data_loading") == 1
            diagnoser.findings = []
            later = dataclasses.replace(snapshot, t=snapshot.t + 1)
            source.set(later)
            await shown(pilot, later)
            assert "cleared: data_loading" in [n.title for n in app._notifications]
            assert bells == [1]


@needs_torch
@pytest.mark.slow
def test_record_on_finding_runs_the_command_with_the_finding_on_stdin(tmp_path) -> None:
    """A real 2-rank job that waits for data: the command hears of it once, however long it lasts.

    A finished run keeps the diagnosis of its last span (the dashboard shows how
    it ended), so its findings do not clear; clearing is tested above.
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
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "gputop.demos.train", "--scenario", "slow_loader", "--seconds", "10"],
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
