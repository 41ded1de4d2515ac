"""Each bundled demo, run for real (2-rank gloo) and short, is diagnosed as the cause it reproduces."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.processes import needs_torch

pytestmark = [pytest.mark.slow, needs_torch]

EXPECTED_TOP = {
    "slow_loader": "data_loading",
    "straggler": "straggler",
    "rotating": "straggler",
    "comm_bound": "communication",
    "small_batch": "parallelism",
    "oversubscribed": "allocation",
}


def run_demo(scenario: str) -> dict:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gputop",
            "demo",
            "--headless",
            "--seconds",
            "8",
            "--format",
            "json",
            "--scenario",
            scenario,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


MEASURED = (
    "steps",
    "samples_per_s",
    "step_time_p50_ms",
    "step_time_p95_ms",
    "comm_exposed_pct",
    "loader_wait_pct",
    "stall_pct",
    "stall_mean_ms",
    "cpu_starved_pct",
)


def measured(report: dict) -> str:
    """What the run measured, for a failure message: each rank's figures and the machine's load."""
    ranks = [{k: r.get(k) for k in ("rank", *MEASURED)} for r in report["runs"][0]["ranks"]]
    return f"load {os.getloadavg()[0]:.1f}; ranks {ranks}"


@pytest.mark.parametrize(("scenario", "cause"), sorted(EXPECTED_TOP.items()))
def test_the_top_finding_is_the_scenarios_own_cause(scenario: str, cause: str) -> None:
    report = run_demo(scenario)
    findings = report["findings"]
    assert findings, f"{scenario}: no findings"
    top = findings[0]
    seen = [(f["severity"], f["cause"], f["ranks"], f["title"]) for f in findings]
    assert top["cause"] == cause, f"{seen}; {measured(report)}"
    assert top["severity"] in ("warn", "critical"), seen
    assert top["evidence"] and top["suggestion"]
    if scenario == "straggler":  # named, with its own slow phase: only rank 1's input is slow
        assert top["ranks"] == [1] and "waiting for its data" in top["title"], seen
    if scenario == "rotating":  # a different rank each step: no one rank is blamed
        assert top["ranks"] == [] and top["title"].startswith("the slowest rank rotates"), seen
