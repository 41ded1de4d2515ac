"""The live chain the dashboard, `record --on-finding` and the exporter share: one snapshot, one refresh."""

from __future__ import annotations

import pytest

from gputop.diagnose import Diagnoser
from gputop.diagnose.alerts import AlertTracker
from gputop.diagnose.pipeline import RefreshPipeline
from gputop.model.figures import Figures
from tests.support.diagnose_fixtures import SLOW_LOADER, make_snapshot


def test_findings_come_worst_first_with_briefs_for_the_ranks_once_and_alerts_after_the_hold() -> None:
    pipeline = RefreshPipeline(diagnoser=Diagnoser(), alerts=AlertTracker(hold_s=2.0))
    updates = [pipeline.update(make_snapshot(SLOW_LOADER, seconds=10.0 + k)) for k in range(6)]
    last = updates[-1]
    assert last.diagnosis == "ok" and last.findings[0].cause == "straggler"
    severities = [f.severity_rank for f in last.findings]
    assert severities == sorted(severities, reverse=True)
    told = [u.to_ranks for u in updates if u.to_ranks]
    assert len(told) == 1 and "straggler" in {b.cause for b in told[0]["run"]}  # told once, when it showed
    raised = [a for u in updates for a in u.alerts]
    assert [(a.kind, a.finding.cause) for a in raised] == [("raised", "straggler")]


def test_without_a_diagnoser_it_says_off_and_a_rule_that_raises_is_a_failed_refresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snapshot = make_snapshot(SLOW_LOADER)
    off = RefreshPipeline().update(snapshot)
    assert off.diagnosis == "off" and off.findings == [] and off.figures.runs

    def broken(self: Diagnoser, figures: Figures) -> list[object]:
        raise ZeroDivisionError("a rule's bug")

    monkeypatch.setattr(Diagnoser, "update", broken)
    failed = RefreshPipeline(diagnoser=Diagnoser()).update(snapshot)
    assert failed.diagnosis == "failed: ZeroDivisionError: a rule's bug" and failed.findings == []
    assert failed.figures.runs  # the figures still show
