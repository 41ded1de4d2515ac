"""`gputop report --compare BEFORE AFTER`: the proof a fix worked, or that it did not, from two recordings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gputop.cli import main
from tests.support.diagnose_fixtures import RankSpec
from tests.support.recordings import record

# Both ranks wait 40% of a 100-ms step for data; after more workers, 1% of a 61-ms step.
SLOW = [RankSpec(rank=r, step_s=0.1, loader_frac=0.4, forward_frac=0.2, backward_frac=0.3, comm_frac=0.08,
                 overlap_frac=0.06) for r in (0, 1)]  # fmt: skip
FIXED = [RankSpec(rank=r, step_s=0.061, loader_frac=0.01, forward_frac=0.33, backward_frac=0.5, comm_frac=0.12,
                  overlap_frac=0.1) for r in (0, 1)]  # fmt: skip


def test_a_fix_that_worked_reads_as_faster_steps_a_share_gone_and_its_finding_cleared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before, after = record(tmp_path / "before.jsonl", SLOW), record(tmp_path / "after.jsonl", FIXED)
    assert main(["report", "--compare", str(before), str(after)]) == 0
    text = capsys.readouterr().out
    first = text.splitlines()[0]
    assert first.startswith("before.jsonl → after.jsonl: steps 1.64x faster (100 → 61 ms, ±0%)"), first
    assert "loader wait 40% → 1%" in first and "data_loading cleared" in first
    assert "cleared: data_loading: ranks 0, 1 wait for data 40% of each step" in text

    assert main(["report", "--compare", str(before), str(after), "--format", "json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert run["step"]["speedup_x"] == pytest.approx(100 / 61, rel=0.01) and run["step"]["beyond_noise"]
    assert [f["cause"] for f in run["findings"]["cleared"]] == ["data_loading"]
    assert run["findings"]["appeared"] == []
    assert {r["rank"]: r["after_ms"] for r in run["ranks"]} == {0: 61.0, 1: 61.0}


def test_a_change_inside_the_noise_is_no_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The same job twice, its exchange swinging window to window: nothing a fix can claim.
    noisy = [RankSpec(rank=r, comm_frac=0.05, comm_swing_frac=0.04) for r in (0, 1)]
    first, second = record(tmp_path / "a.jsonl", noisy), record(tmp_path / "b.jsonl", noisy, seconds=24.0)
    assert main(["report", "--compare", str(first), str(second), "--format", "markdown"]) == 0
    text = capsys.readouterr().out
    assert "step time unchanged within noise" in text and "cleared" not in text and "appeared" not in text


@pytest.mark.parametrize(
    "argv",
    [["report"], ["report", "one.jsonl", "--compare", "a.jsonl", "b.jsonl"]],
)
def test_one_recording_or_a_pair_is_a_usage_error_otherwise(argv: list[str], capsys) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("gputop: ")


def test_a_file_that_is_not_a_recording_is_one_line(tmp_path: Path, capsys) -> None:
    good = record(tmp_path / "good.jsonl", FIXED)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not a recording\n")
    assert main(["report", "--compare", str(good), str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("gputop: ") and "\n" not in err


def test_each_collectives_exposed_time_before_and_after() -> None:
    """Prefetching the all-gathers: their exposed time a step falls, the reduce-scatters' stays."""
    from gputop.model.figures import summarize
    from gputop.report.compare import compare_collectives
    from tests.support import tui_fixtures

    before = summarize(tui_fixtures.fsdp2_ranks(), span_s=None).runs[0]
    after = summarize(tui_fixtures.fsdp2_ranks(gather_exposed_s=0.005), span_s=None).runs[0]
    rows = {row["collective"]: row for row in compare_collectives(before, after)}
    assert rows["all_gather on dp"] == {"collective": "all_gather on dp", "before_exposed_ms": 21.0,
                                        "after_exposed_ms": 5.0}  # fmt: skip
    assert rows["reduce_scatter on dp"]["before_exposed_ms"] == rows["reduce_scatter on dp"]["after_exposed_ms"] == 9.0


def test_the_work_each_step_does_before_and_after(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A batch four times larger: the same FLOPs a sample, the step's compute from 6% to 32% of the CPU's peak."""
    peak = {"cpu_peak_flops": 100e9, "device": "cpu"}
    small = [RankSpec(rank=r, step_s=0.02, flops_per_s=6e9, hello=peak) for r in (0, 1)]
    large = [RankSpec(rank=r, step_s=0.03, flops_per_s=32e9, hello=peak) for r in (0, 1)]
    before, after = record(tmp_path / "b2.jsonl", small), record(tmp_path / "b8.jsonl", large)
    assert main(["report", "--compare", str(before), str(after)]) == 0
    text = capsys.readouterr().out
    assert "MFU 6% → 32%" in text.splitlines()[0], text
    assert main(["report", "--compare", str(before), str(after), "--format", "json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    mfu = next(p for p in run["phases"] if p["phase"] == "MFU")
    assert (mfu["before"], mfu["after"]) == (6.0, 32.0)
