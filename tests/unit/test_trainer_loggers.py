"""What the trainer loggers tell the ranks: a run's findings, only when they change."""

from __future__ import annotations

from gputop.diagnose.alerts import FindingsToRanks
from gputop.diagnose.findings import Finding
from gputop.protocol import FindingBrief


def test_ranks_hear_of_their_runs_findings_only_when_they_change() -> None:
    told = FindingsToRanks()
    loader = Finding(cause="data_loading", severity="warn", title="waits", suggestion="s", ranks=(1,), run_id="a")
    assert told.changed([loader]) == {"a": (FindingBrief(cause="data_loading", severity="warn", title="waits",
                                                         ranks=(1,)),)}  # fmt: skip
    assert told.changed([loader]) == {}
    assert told.changed([]) == {"a": ()}  # cleared: said once
    assert told.changed([]) == {}
