"""One definition per figure: the table, the detail screen, the report and the findings quote the same numbers.

Each test builds a snapshot from fixed windows and takes it down every path a
user reads it by: the dashboard's view (what the worker thread builds and the
table renders), ``gputop report --format json`` (``report.render``), and the
findings' evidence.  The same rank's figure must be the same number on all of
them, and the ▲ slowest marker must name the rank the straggler finding names.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import msgspec
import pytest

from gputop import report
from gputop.combine import phase_seconds
from gputop.diagnose import Finding, diagnose
from gputop.model import figures
from gputop.model.figures import WindowFiguresMemo, rank_series, summarize
from gputop.model.snapshot import Snapshot
from gputop.tui.format import fmt_frac
from gputop.tui.palette import Palette
from gputop.tui.view import DashboardView, build_view
from gputop.tui.widgets.rank_cells import row_cells
from tests.support.diagnose_fixtures import RankSpec, make_snapshot


def every_path(snapshot: Snapshot) -> tuple[DashboardView, dict[str, Any], list[Finding]]:
    """The dashboard's view, the JSON report and the findings of one snapshot, each as its user gets it."""
    figures = summarize(snapshot)
    findings = diagnose(figures)
    view = build_view(figures, findings, "ok")
    return view, json.loads(report.render(snapshot, "json")), findings


def report_rank(data: dict[str, Any], rank: int) -> dict[str, Any]:
    (run,) = data["runs"]
    return next(r for r in run["ranks"] if r["rank"] == rank)


def evidence(finding: Finding, metric: str, rank: int | None) -> float:
    return next(e.value for e in finding.evidence if e.metric == metric and e.rank == rank)


def only(findings: list[Finding], cause: str) -> Finding:
    found = [f for f in findings if f.cause == cause]
    assert len(found) == 1, [f.title for f in findings]
    return found[0]


WAITING_RANKS = tuple(
    RankSpec(rank=r, loader_frac=loader, comm_frac=0.3, overlap_frac=overlap)
    for r, loader, overlap in [(0, 0.20, 0.05), (1, 0.30, 0.08), (2, 0.25, 0.06), (3, 0.40, 0.07)]
)


class TestSharesOfStepTime:
    """Every rank waits for data and for the exchange: loader and comm shares, four ways."""

    def test_loader_wait(self) -> None:
        view, data, findings = every_path(make_snapshot(WAITING_RANKS))
        loading = only(findings, "data_loading")
        worst = max(view.rank_rows, key=lambda r: r.stats.phases.loader_wait_frac or 0.0)
        for row in view.rank_rows:
            shown = row.stats.phases.loader_wait_frac
            assert shown is not None
            assert report_rank(data, row.rank)["loader_wait_pct"] == pytest.approx(shown * 100, abs=0.005)
            assert row_cells(row, Palette())["loader"].plain == fmt_frac(shown)
        assert evidence(loading, "loader_wait_pct", worst.rank) == pytest.approx(
            (worst.stats.phases.loader_wait_frac or 0) * 100
        )
        run_mean = sum(r.stats.phases.loader_wait_frac or 0.0 for r in view.rank_rows) / len(view.rank_rows)
        assert evidence(loading, "loader_wait_pct", None) == pytest.approx(run_mean * 100)

    def test_exposed_comm(self) -> None:
        view, data, findings = every_path(make_snapshot(WAITING_RANKS))
        communication = only(findings, "communication")
        least = min(view.rank_rows, key=lambda r: r.stats.phases.exposed_comm_frac or 0.0)
        for row in view.rank_rows:
            shown = row.stats.phases.exposed_comm_frac
            assert shown is not None
            assert report_rank(data, row.rank)["comm_exposed_pct"] == pytest.approx(shown * 100, abs=0.005)
            assert row_cells(row, Palette())["comm"].plain == fmt_frac(shown)
        assert evidence(communication, "exposed_comm_pct", least.rank) == pytest.approx(
            (least.stats.phases.exposed_comm_frac or 0) * 100
        )

    def test_the_work_each_step_does(self) -> None:
        """FLOPs a step, FLOP/s and MFU: the table's cells, the report's figures and the parallelism evidence."""
        specs = [RankSpec(rank=r, step_s=0.02, flops_per_s=(5e9, 8e9)[r], hello={"cpu_peak_flops": 100e9})
                 for r in (0, 1)]  # fmt: skip
        view, data, _ = every_path(make_snapshot(specs, hello={"loader_batch_size": 2}))
        for row in view.rank_rows:
            achieved = (5e9, 8e9)[row.rank]
            rank = report_rank(data, row.rank)
            assert rank["achieved_flops_per_s"] == pytest.approx(achieved)
            assert rank["flops_per_step"] == pytest.approx(achieved * 0.02, rel=1e-6)
            assert rank["mfu_pct"] == pytest.approx(100 * achieved / 100e9)
            cells = row_cells(row, Palette())
            assert cells["flops_s"].plain == ("5G", "8G")[row.rank]
            assert cells["flops"].plain == ("100M", "160M")[row.rank]
            assert cells["mfu"].plain == ("5.0%", "8.0%")[row.rank]

    def test_the_histories_use_the_same_definitions(self) -> None:
        view, _, _ = every_path(make_snapshot(WAITING_RANKS))
        for row in view.rank_rows:
            series = view.series(row.key)
            assert series is not None
            # Steady windows: each window's share is the span's share.
            assert series.loader_wait_frac[-1] == pytest.approx(row.stats.phases.loader_wait_frac)
            assert series.exposed_comm_frac[-1] == pytest.approx(row.stats.phases.exposed_comm_frac)


class TestStraggler:
    """Rank 2's backward pass is slow; ranks 0, 1 and 3 wait for it in the all-reduce."""

    def snapshot(self) -> Snapshot:
        specs = [RankSpec(rank=i, backward_frac=0.4, comm_frac=0.35, overlap_frac=0.05) for i in (0, 1, 3)]
        specs.insert(2, RankSpec(rank=2, backward_frac=0.7, comm_frac=0.07, overlap_frac=0.05))
        return make_snapshot(specs)

    def test_the_marker_names_the_rank_the_finding_names(self) -> None:
        view, data, findings = every_path(self.snapshot())
        straggler = only(findings, "straggler")
        assert [row.rank for row in view.rank_rows if row.slowest] == list(straggler.ranks) == [2]
        assert [f["ranks"] for f in data["findings"] if f["cause"] == "straggler"] == [[2]]
        assert row_cells(view.row("run:2"), Palette())["rank"].plain == "▲2"  # type: ignore[arg-type]

    def test_the_slow_phase_is_the_detail_screens_share(self) -> None:
        view, data, findings = every_path(self.snapshot())
        row = view.row("run:2")
        assert row is not None and row.stats.step.mean_s
        backward_s = phase_seconds(row.stats.phases)["backward"]
        assert backward_s is not None
        share_pct = backward_s / row.stats.step.mean_s * 100
        assert evidence(only(findings, "straggler"), "backward_pct", 2) == pytest.approx(share_pct)
        assert report_rank(data, 2)["backward_ms"] == pytest.approx(backward_s * 1000, abs=0.0005)

    def test_no_finding_no_marker(self) -> None:
        snapshot = make_snapshot([RankSpec(rank=i) for i in range(4)])
        view, _, findings = every_path(snapshot)
        assert [f for f in findings if f.cause == "straggler"] == []
        assert not any(row.slowest for row in view.rank_rows)


class TestGputopsOwnCost:
    """What gputop costs, as its reporters account for it: the header's figure is the report's."""

    def test_header_and_report_agree(self) -> None:
        from tests.support import tui_fixtures as fx

        snapshot = fx.self_accounting()
        view, data, _ = every_path(snapshot)
        (run,) = view.runs
        (report_run,) = data["runs"]
        cost = report_run["gputop_cost"]
        assert run.gputop_cost.cpu_frac is not None and run.gputop_cost.hook_s_per_step is not None
        assert cost["cpu_share_pct"] == pytest.approx(run.gputop_cost.cpu_frac * 100, abs=0.0005)
        assert cost["hook_us_per_step"] == pytest.approx(run.gputop_cost.hook_s_per_step * 1e6, abs=0.005)
        assert report_rank(data, 0)["gputop_reporter_cpu_pct"] == pytest.approx(0.2)  # 1 ms per 0.5-s window
        text = report.render(snapshot, "text")
        assert "gputop's own cost: 0.22% of the ranks' CPU, reporter thread 0.20% of a core per rank" in text
        assert "10.0 µs per step on the training thread" in text


def test_the_on_screen_ranks_histories_read_each_windows_figures_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The figures thread asks for the same rank's 240 windows every refresh; one window is new.
    rank = make_snapshot(WAITING_RANKS).runs[0].ranks[3]
    newest = rank.windows[-1]
    arrived = msgspec.structs.replace(newest, seq=newest.seq + 1, loader_wait_s=2 * (newest.loader_wait_s or 0.0))
    later = replace(rank, windows=(*rank.windows[1:], arrived))
    memo = WindowFiguresMemo()
    assert rank_series(rank, (), 240, memo) == rank_series(rank, (), 240)
    computed: list[int] = []
    define = figures._window_figures
    monkeypatch.setattr(figures, "_window_figures", lambda w: computed.append(w.seq) or define(w))
    series = rank_series(later, (), 240, memo)
    assert computed == [arrived.seq], "only the new window's figures are computed"
    monkeypatch.undo()
    assert series == rank_series(later, (), 240)  # the same figures as computed afresh
    assert series.loader_wait_frac[-1] != series.loader_wait_frac[-2]
