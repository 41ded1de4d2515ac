"""The accuracy benchmark's scoring (benchmarks/diagnosis_accuracy.py) on made-up reports: no job runs.

A run is right when its top finding names the case's cause and, where the case
says which, the ranks that have it; the right cause on the wrong ranks is
counted apart; a healthy run whose live view showed a warning is wrong; a run
whose premise never happened is neither.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gputop.demos.scenarios import SCENARIOS
from gputop.diagnose.findings import Cause, Finding, Severity

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("diagnosis_accuracy", ROOT / "benchmarks" / "diagnosis_accuracy.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
sys.modules["diagnosis_accuracy"] = bench  # dataclasses look their module up by name
_spec.loader.exec_module(bench)

CHECKPOINT = bench.Case("stall_checkpoint_rank0", "stall", "rank 0 saves a checkpoint", ranks=(0,))


def finding(cause: str, ranks: list[int], severity: str = "warn") -> dict[str, Any]:
    """A finding as `gputop report --format json` writes one, with what the scoring reads."""
    return {"cause": cause, "severity": severity, "title": f"{cause} on {ranks}", "ranks": ranks}


def report(*findings: dict[str, Any], steps: int = 30, rank0_steps: int | None = None) -> dict[str, Any]:
    ranks = [{"rank": 0, "steps": steps if rank0_steps is None else rank0_steps}, {"rank": 1, "steps": steps}]
    return {"runs": [{"ranks": ranks}], "findings": list(findings)}


def test_the_right_cause_on_the_right_ranks_is_right() -> None:
    result = bench.result_of(CHECKPOINT, 1, report(finding("stall", [0])), 20.0)
    assert result.named == (0,)
    assert result.right and not result.ranks_wrong
    summary = bench.summary([result])
    assert summary["right"] == 1 and summary["ranks_wrong"] == []
    assert "stall [0]" in bench.runs_markdown([result])


def test_the_right_cause_on_the_wrong_ranks_is_counted_apart_not_right() -> None:
    # Issue #35: "ranks 0, 1 stop 414 ms every 10 steps" where rank 0 alone saved and rank 1 only waited.
    result = bench.result_of(CHECKPOINT, 1, report(finding("stall", [0, 1])), 20.0)
    assert result.cause_right and not result.right and result.ranks_wrong
    summary = bench.summary([result])
    assert summary["right"] == 0
    assert summary["ranks_wrong"] == ["stall_checkpoint_rank0 run 1: stall named [0, 1], the case's is [0]"]
    table = bench.confusion_markdown([result])
    assert bench.RANKS_WRONG in table.splitlines()[0]
    assert bench.RANKS_WRONG in bench.runs_markdown([result])


def test_ranks_not_checked_score_the_cause_alone() -> None:
    hog = bench.Case("allocation_outside_cpu_hog", "allocation", "a hog", ranks=None)
    result = bench.result_of(hog, 1, report(finding("allocation", [1])), 20.0)
    assert result.right


def test_no_one_rank_is_right_only_for_a_finding_that_names_none() -> None:
    rotating = bench.Case("straggler_rotating", "straggler", "the longest batch's rank", ranks=())
    assert bench.result_of(rotating, 1, report(finding("straggler", [])), 20.0).right
    assert bench.result_of(rotating, 1, report(finding("straggler", [1])), 20.0).ranks_wrong


def test_allocation_first_scores_the_case_own_finding_ranks() -> None:
    findings = (finding("allocation", [0, 1], severity="critical"), finding("stall", [1], severity="info"))
    result = bench.result_of(CHECKPOINT, 1, report(*findings), 20.0, condition="neighbour")
    assert result.allocation_first and result.named == (1,)
    assert result.ranks_wrong and not result.right
    right = bench.result_of(
        CHECKPOINT, 1, report(findings[0], finding("stall", [0], severity="info")), 20.0, condition="neighbour"
    )
    assert right.right and bench.summary([right])["allocation_first"] == 1


def test_a_healthy_case_under_a_neighbour_checks_no_ranks() -> None:
    healthy = bench.Case("healthy_convnet", bench.HEALTHY, "convnet")
    under = healthy.under("neighbour")
    assert (under.expected, under.ranks) == ("allocation", None)
    assert bench.result_of(under, 1, report(finding("allocation", [0])), 20.0, condition="neighbour").right


def test_a_void_premise_is_neither_right_nor_wrong(tmp_path: Path) -> None:
    hang = bench.Case("hang_rank1_lock", "hang", "rank 1 blocks at step 10", premise_step=10, ranks=(1,))
    for findings in ((), (finding("hang", [0, 1], severity="critical"),)):
        result = bench.result_of(hang, 1, report(*findings, steps=8), 20.0)
        void = bench.premise_missing(hang, result.steps, tmp_path / "none.onset")
        assert void == "the job reached step 8 of the 10 its cause begins at"
        result = replace(result, void=void)
        assert not result.right and not result.ranks_wrong
        summary = bench.summary([result])
        assert (summary["runs"], summary["right"], summary["ranks_wrong"]) == (0, 0, [])
        assert summary["void"] == [f"hang_rank1_lock run 1: {void}"]


def test_a_quiet_run_beside_a_busy_foreign_process_is_void_with_its_pid(tmp_path: Path) -> None:
    """A pass beside other work scores the allocation rule naming that work's pid, not the case (issue #56)."""
    from gputop.collect import recording
    from gputop.model.samples import BusyProcess, HostSample, ProcessReading
    from gputop.protocol import Hello

    def run_beside(busy: tuple[BusyProcess, ...]) -> Path:
        path = tmp_path / f"run{len(busy)}.jsonl"
        rec = recording.Recorder(path, source="test")
        for rank in (0, 1):
            rec.message(Hello(run_id="r", rank=rank, world_size=2, pid=100 + rank, parent_pid=99), 100.0)
        for k in range(5):
            rec.sample(
                HostSample(
                    t=101.0 + k,
                    cpu_pct=90.0,
                    cpu_count=2,
                    gputop_pid=50,
                    busy=busy,
                    processes=(ProcessReading(pid=100, child_pids=(110,)), ProcessReading(pid=101)),
                )
            )
        rec.close()
        return path

    mine = (
        BusyProcess(pid=110, name="pt_data_worker", cpu_pct=95.0),
        BusyProcess(pid=99, name="torchrun", cpu_pct=60.0),
        BusyProcess(pid=50, name="python", cpu_pct=80.0),
    )  # a loader worker, the launcher, the recorder
    assert bench.neighbour_seen(run_beside(mine)) == ""
    hog = BusyProcess(pid=4242, name="python", command="python burn.py", cpu_pct=70.0)
    assert bench.neighbour_seen(run_beside((*mine, hog))) == (
        "not quiet: pid 4242 (python burn.py) held 70% of a core beside the job"
    )


def test_a_premise_is_the_case_own_ranks_a_waiting_rank_that_went_silent_early_does_not_void_it(
    tmp_path: Path,
) -> None:
    """Rank 1 blocked at step 10; rank 0, waiting in the all-reduce with the GIL held, last reported step 8."""
    hang = bench.Case("hang_rank1_lock", "hang", "rank 1 blocks at step 10", premise_step=10, ranks=(1,))
    result = bench.result_of(hang, 1, report(finding("hang", [1], severity="critical"), steps=10, rank0_steps=8), 20.0)
    assert bench.premise_missing(hang, result.steps, tmp_path / "none.onset") == ""
    assert result.right
    every = bench.Case("compile", "recompile", "every rank recompiles", premise_step=30, ranks=bench.ALL_RANKS)
    short = bench.result_of(every, 1, report(steps=40, rank0_steps=12), 20.0)
    assert bench.premise_missing(every, short.steps, tmp_path / "none.onset").startswith("the job reached step 12")


def test_every_case_says_which_ranks_or_why_not() -> None:
    """A case with a cause on rank-specific code names its ranks; a healthy case checks none."""
    for case in bench.CASES:
        if case.expected == bench.HEALTHY:
            assert case.ranks is None, case.name
        if "rank1" in case.name or "rank0" in case.name:
            assert case.ranks == ((1,) if "rank1" in case.name else (0,)), case.name


def test_a_case_whose_premise_needs_a_gpu_is_void_on_the_cpu(tmp_path: Path) -> None:
    """FSDP2 hides its all-gathers only on a GPU: on gloo the "healthy" example exposes them, and is not scored."""
    case = bench.Case("fsdp2_healthy", bench.HEALTHY, "FSDP2", gpu_premise="FSDP2 overlaps only on a GPU")
    cpu = report(finding("communication", [0, 1]))
    for r in cpu["runs"][0]["ranks"]:
        r["device"] = "cpu"
    result = bench.result_of(case, 1, cpu, 20.0)
    assert result.on_cpu
    assert bench.premise_missing(case, result.steps, tmp_path / "none", on_cpu=result.on_cpu) == (
        "FSDP2 overlaps only on a GPU; this run was on the CPU"
    )
    gpu = report()
    for r in gpu["runs"][0]["ranks"]:
        r["device"] = "cuda:0"
    result = bench.result_of(case, 1, gpu, 20.0)
    assert not result.on_cpu and bench.premise_missing(case, result.steps, tmp_path / "none") == ""
    assert result.right


HEALTHY_DEMO = bench.Case("demo_healthy", bench.HEALTHY, "the healthy demo", demo="healthy")


def test_a_healthy_run_that_showed_a_warning_live_is_wrong_though_its_report_is_clean() -> None:
    """What a newcomer saw was the warning, not the clean report written at the end."""
    clean = bench.result_of(HEALTHY_DEMO, 1, report(), 20.0)
    alarmed = replace(clean, shown_live=("communication",))
    assert clean.right and bench.scored(clean) == bench.HEALTHY
    assert not alarmed.right and not alarmed.cause_right and not alarmed.ranks_wrong
    assert bench.scored(alarmed) == bench.SHOWN_LIVE
    summary = bench.summary([clean, alarmed])
    assert summary["right"] == 1 and summary["shown_live"] == ["demo_healthy run 1: communication"]
    assert bench.confusion_markdown([clean, alarmed]).splitlines()[0].endswith(f"| {bench.SHOWN_LIVE} |")
    assert "✗ (shown live: communication)" in bench.runs_markdown([alarmed])
    assert "healthy runs with a warning shown live: 1;" in bench.summary_text(summary)


def test_a_healthy_run_wrong_in_its_report_counts_under_its_top_not_the_live_column() -> None:
    result = replace(
        bench.result_of(HEALTHY_DEMO, 1, report(finding("straggler", [1])), 20.0), shown_live=("straggler",)
    )
    assert not result.right and bench.scored(result) == "straggler"


def test_the_live_view_of_a_healthy_run_keeps_warnings_and_any_straggler(monkeypatch: pytest.MonkeyPatch) -> None:
    """Warn/critical causes at any refresh, and a straggler even at info: a healthy rank called slow."""

    def shown(cause: Cause, severity: Severity) -> Finding:
        return Finding(cause=cause, severity=severity, title=f"{cause} {severity}", suggestion="")

    refreshes = [
        (0.5, [shown("memory", "info")]),
        (1.0, [shown("communication", "warn"), shown("straggler", "info")]),
        (1.5, []),
    ]
    monkeypatch.setattr(bench, "live_view", lambda path: iter(refreshes))
    assert bench.live_alarms(Path("run.jsonl")) == ("communication", "straggler (info)")
    monkeypatch.setattr(bench, "live_view", lambda path: iter([(0.5, [shown("memory", "info")])]))
    assert bench.live_alarms(Path("run.jsonl")) == ()


def test_the_demo_cases_run_the_bundled_script_with_their_scenario() -> None:
    demos = {c.name: c for c in bench.CASES if c.demo}
    assert {n: (c.expected, c.ranks) for n, c in demos.items()} == {
        "demo_healthy": (bench.HEALTHY, None),
        "demo_slow_loader": ("data_loading", (0, 1)),
        "demo_straggler": ("straggler", (1,)),
        "demo_rotating": ("straggler", ()),
        "demo_comm_bound": ("communication", (0, 1)),
        "demo_small_batch": ("parallelism", (0, 1)),
        "demo_oversubscribed": ("allocation", (0, 1)),
        "demo_healthy_minute": (bench.HEALTHY, None),
    }
    assert all(c.demo in SCENARIOS and not c.unseen for c in demos.values())
    assert demos["demo_healthy_minute"].seconds == 60.0
    cmd = bench.job_command(demos["demo_straggler"], 14.0)
    assert bench.DEMO_TRAIN.is_file() and cmd[-5:] == [
        str(bench.DEMO_TRAIN),
        "--scenario",
        "straggler",
        "--seconds",
        "14.0",
    ]
    assert "--case" in bench.job_command(bench.case_of("healthy_convnet"), 14.0)
