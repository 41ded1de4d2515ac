"""Alerts: a finding that holds rings once, again when it worsens or clears, never in a storm."""

from __future__ import annotations

import dataclasses

from gputop.diagnose.alerts import AlertTracker
from gputop.diagnose.findings import Evidence, Finding

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
