"""Diagnoser: a finding shows after firing for 1 s, clears after 2 s without it, and does not flicker.

Updates come every 0.5 s here, as at the dashboard's default refresh: 3 in a
row to show, 5 in a row to clear.
"""

from __future__ import annotations

from collections.abc import Sequence

from gputop.diagnose import Cause, Diagnoser, Finding, Severity
from gputop.model.figures import summarize
from tests.support.diagnose_fixtures import make_snapshot, two_ranks

REFRESH_S = 0.5


def feed_all(
    diagnoser: Diagnoser, updates: Sequence[list[Finding]], refresh_s: float = REFRESH_S
) -> list[list[Finding]]:
    """Each update's fired findings, ``refresh_s`` apart; what is shown after each."""
    return [diagnoser.feed(fired, i * refresh_s) for i, fired in enumerate(updates)]


def finding(severity: Severity = "warn", ranks: tuple[int, ...] = (0, 1), cause: Cause = "data_loading") -> Finding:
    return Finding(cause=cause, severity=severity, title="t", suggestion="s", ranks=ranks, run_id="run")


def run(diagnoser: Diagnoser, pattern: str, **kwargs: object) -> list[int]:
    """Feed 'x' (fired) / '.' (not) updates; the number of findings shown after each."""
    updates = [[finding(**kwargs)] if c == "x" else [] for c in pattern]  # type: ignore[arg-type]
    return [len(shown) for shown in feed_all(diagnoser, updates)]


class TestPersistence:
    """At a 0.5-s refresh: show after 3 firings in a row, clear after 5 misses in a row."""

    def test_appears_after_three(self) -> None:
        assert run(Diagnoser(), "xxxx") == [0, 0, 1, 1]

    def test_a_blip_never_shows(self) -> None:
        assert run(Diagnoser(), "xx.xx.xx.") == [0] * 9

    def test_clears_after_five_misses(self) -> None:
        assert run(Diagnoser(), "xxx.....") == [0, 0, 1, 1, 1, 1, 1, 0]

    def test_hovering_at_the_threshold_does_not_flicker(self) -> None:
        assert run(Diagnoser(), "xxx.x.x..x.x") == [0, 0] + [1] * 10

    def test_custom_delays(self) -> None:
        assert run(Diagnoser(show_after_s=0, clear_after_s=0), "x.x") == [1, 0, 1]

    def test_delays_are_seconds_not_updates(self) -> None:
        """At a 2-s refresh the finding shows on the second update: 1 s has passed, not 3 updates."""
        shown = feed_all(Diagnoser(), [[finding()], [finding()]], refresh_s=2.0)
        assert [len(s) for s in shown] == [0, 1]


class TestSeverityHysteresis:
    def test_escalates_after_three_and_calms_after_five(self) -> None:
        diagnoser = Diagnoser()
        warn: Severity = "warn"
        critical: Severity = "critical"
        fired = [warn] * 3 + [critical] * 3 + [warn] * 5
        shown = feed_all(diagnoser, [[finding(s)] for s in fired])
        assert [f[0].severity for f in shown[2:]] == ["warn"] * 3 + ["critical"] * 5 + ["warn"]

    def test_one_critical_window_does_not_escalate(self) -> None:
        diagnoser = Diagnoser()
        severities: list[Severity] = ["warn", "warn", "warn", "critical", "warn"]
        shown = feed_all(diagnoser, [[finding(s)] for s in severities])
        assert [f[0].severity for f in shown[2:]] == ["warn", "warn", "warn"]

    def test_while_calming_down_the_words_stay_with_the_severity_shown(self) -> None:
        """A warning that now fires as 'too close to call' info keeps its warning's title until it calms down."""
        diagnoser = Diagnoser()
        warn = [
            Finding(
                cause="straggler",
                severity="warn",
                title=f"rank 1 is slow: {n}%",
                suggestion="s",
                ranks=(1,),
                run_id="run",
            )
            for n in (21, 22, 23)
        ]
        info = [Finding(cause="straggler", severity="info", title=f"{n}%, too close to call", suggestion="s",
                        ranks=(1,), run_id="run") for n in range(14, 9, -1)]  # fmt: skip
        shown = [f[0] for f in feed_all(diagnoser, [[f] for f in warn + info])[2:]]
        assert [(f.severity, f.title) for f in shown] == [("warn", "rank 1 is slow: 23%")] * 5 + [
            ("info", "10%, too close to call")
        ]


class TestKeys:
    def test_rank_set_drifting_by_one_keeps_its_history(self) -> None:
        diagnoser = Diagnoser()
        shown = feed_all(diagnoser, [[finding(ranks=r)] for r in [(0, 1), (0,), (0, 1), (1,)]])
        assert [len(s) for s in shown] == [0, 0, 1, 1]
        assert shown[-1][0].ranks == (1,)

    def test_different_causes_are_tracked_apart(self) -> None:
        diagnoser = Diagnoser(show_after_s=0)
        shown = diagnoser.feed(
            [finding(cause="data_loading"), finding(cause="communication", severity="critical")], 0.0
        )
        assert [f.cause for f in shown] == ["communication", "data_loading"]


class TestOnSnapshots:
    def test_update_diagnoses_snapshots(self) -> None:
        diagnoser = Diagnoser()
        slow = [make_snapshot(two_ranks(loader_frac=0.3), seconds=10 + i * REFRESH_S) for i in range(3)]
        healthy = [make_snapshot(two_ranks(), seconds=10 + i * REFRESH_S) for i in range(3, 8)]
        shown = [len(diagnoser.update(summarize(s))) for s in slow + healthy]
        assert shown == [0, 0, 1, 1, 1, 1, 1, 0]
