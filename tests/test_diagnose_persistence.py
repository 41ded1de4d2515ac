"""Diagnoser: a finding shows after N consecutive firings, clears after M misses, and does not flicker."""

from __future__ import annotations

from gputop.diagnose import Diagnoser, Finding
from tests.diagnose_fixtures import make_snapshot, two_ranks


def finding(severity: str = "warn", ranks: tuple[int, ...] = (0, 1), cause: str = "data_loading") -> Finding:
    return Finding(cause=cause, severity=severity, title="t", suggestion="s", ranks=ranks, run_id="run")


def run(diagnoser: Diagnoser, pattern: str, **kwargs: object) -> list[int]:
    """Feed 'x' (fired) / '.' (not) updates; the number of findings shown after each."""
    return [len(diagnoser.feed([finding(**kwargs)] if c == "x" else [])) for c in pattern]  # type: ignore[arg-type]


class TestPersistence:
    """Show after 3 firings in a row, clear after 5 misses in a row."""

    def test_appears_after_three(self) -> None:
        assert run(Diagnoser(), "xxxx") == [0, 0, 1, 1]

    def test_a_blip_never_shows(self) -> None:
        assert run(Diagnoser(), "xx.xx.xx.") == [0] * 9

    def test_clears_after_five_misses(self) -> None:
        assert run(Diagnoser(), "xxx.....") == [0, 0, 1, 1, 1, 1, 1, 0]

    def test_hovering_at_the_threshold_does_not_flicker(self) -> None:
        assert run(Diagnoser(), "xxx.x.x..x.x") == [0, 0] + [1] * 10

    def test_custom_counts(self) -> None:
        assert run(Diagnoser(show_after=1, clear_after=1), "x.x") == [1, 0, 1]


class TestSeverityHysteresis:
    def test_escalates_after_three_and_calms_after_five(self) -> None:
        diagnoser = Diagnoser()
        fired = ["warn"] * 3 + ["critical"] * 3 + ["warn"] * 5
        shown = [diagnoser.feed([finding(s)]) for s in fired]
        assert [f[0].severity for f in shown[2:]] == ["warn"] * 3 + ["critical"] * 5 + ["warn"]

    def test_one_critical_window_does_not_escalate(self) -> None:
        diagnoser = Diagnoser()
        shown = [diagnoser.feed([finding(s)]) for s in ["warn", "warn", "warn", "critical", "warn"]]
        assert [f[0].severity for f in shown[2:]] == ["warn", "warn", "warn"]


class TestKeys:
    def test_rank_set_drifting_by_one_keeps_its_history(self) -> None:
        diagnoser = Diagnoser()
        shown = [diagnoser.feed([finding(ranks=r)]) for r in [(0, 1), (0,), (0, 1), (1,)]]
        assert [len(s) for s in shown] == [0, 0, 1, 1]
        assert shown[-1][0].ranks == (1,)

    def test_different_causes_are_tracked_apart(self) -> None:
        diagnoser = Diagnoser(show_after=1)
        shown = diagnoser.feed([finding(cause="data_loading"), finding(cause="communication", severity="critical")])
        assert [f.cause for f in shown] == ["communication", "data_loading"]


class TestOnSnapshots:
    def test_update_diagnoses_snapshots(self) -> None:
        diagnoser = Diagnoser()
        slow = make_snapshot(two_ranks(loader_frac=0.3))
        healthy = make_snapshot(two_ranks())
        shown = [len(diagnoser.update(s)) for s in [slow] * 3 + [healthy] * 5]
        assert shown == [0, 0, 1, 1, 1, 1, 1, 0]
