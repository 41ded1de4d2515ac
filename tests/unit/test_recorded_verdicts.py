"""How the rules read real jobs: recordings of real 2-rank gloo runs (tests/support/record_runs.py), read back.

Each run was a real job shaped the way users write them, far from its threshold,
recorded once as `gputop record` sees it (the host sampled too).  Read back here
with the rules as they are now, it must get the verdict, the ranks and the words
a user reads: what a rule change does to real measurements, in milliseconds and
the same every time.  Measuring (what a live job sends) is the integration tier's;
how often a fresh run is read right, under three conditions, is
benchmarks/diagnosis_accuracy.py's, where every job here is a case.  A test that
fails here after a rule change names the run, what was measured and what was found.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache

import pytest

from gputop import report, settings
from gputop.collect import recording
from gputop.diagnose import Diagnoser, diagnose
from gputop.diagnose.alerts import AlertTracker
from gputop.diagnose.findings import Finding
from gputop.diagnose.grading import measured as measured_ranks
from gputop.diagnose.pipeline import Refresh, RefreshPipeline
from gputop.diagnose.rules.rotating import step_pattern
from gputop.diagnose.thresholds import RECOMPILE_WARN_FRAC
from gputop.export.metrics import families
from gputop.model.figures import Figures, summarize
from gputop.model.snapshot import SPAN_COPY_WINDOWS, Snapshot
from tests.support.diagnose_fixtures import straggler_of
from tests.support.record_runs import BUSY_LOOP, path_of


@cache
def recorded(name: str) -> tuple[Snapshot, Figures, tuple[Finding, ...], str]:
    """The whole run as `gputop report` reads it: its snapshot, figures, findings, and what was measured and found."""
    store, last_t = recording.load(path_of(name))
    snapshot = store.snapshot(last_t, history=None)
    figures = summarize(snapshot, span_s=None)
    findings = tuple(diagnose(figures))
    return snapshot, figures, findings, f"{name}: {measured(figures)}; found {found(findings)}"


def measured(figures: Figures) -> str:
    return "; ".join(
        f"rank {r.rank}: {r.stats.steps} steps of {1e3 * (r.stats.step.mean_s or 0):.0f} ms, "
        f"cpu wait {100 * (r.stats.cpu.starved_frac or 0):.0f}% wanting {r.stats.cpu.demand_cores or 0:.2f} CPUs, "
        f"loader {100 * (r.stats.phases.loader_wait_frac or 0):.0f}%, "
        f"exposed comm {100 * (r.stats.phases.exposed_comm_frac or 0):.0f}%, "
        f"stalls {r.stats.stalls.steps} of {1e3 * (r.stats.stalls.mean_s or 0):.0f} ms"
        for r in figures.all_ranks()
    )


def found(findings: tuple[Finding, ...] | list[Finding]) -> str:
    return " | ".join(f"[{f.severity}] {f.cause} {list(f.ranks)}: {f.title}" for f in findings)


# -- jobs from tests/support/jobs ----------------------------------------------------------------


def test_workers_with_a_cpu_heavy_transform_on_too_few_cores_are_named_cpu_oversubscription() -> None:
    """2 ranks x (1 main + 3 workers) burning CPU on 2 cores: allocation, never 'compress gradients' or 'I/O'.

    Eight CPU-bound processes on two cores wait for a CPU about two thirds of the time they are ready to run,
    well past the 25% line.
    """
    _, _, findings, summary = recorded("allocation_workers_cpu_transform")
    top = findings[0]
    assert top.cause == "allocation" and top.severity in ("warn", "critical"), summary
    assert "2 ranks x (1 main + 3 workers)" in top.title and "want" in top.title, summary
    assert all(f.severity == "info" for f in findings if f.cause in ("communication", "data_loading")), summary
    assert not any("not CPU-bound" in f.suggestion or "likely I/O" in f.suggestion for f in findings), summary


def test_programs_outside_the_job_that_take_the_cores_are_the_finding_not_its_symptoms() -> None:
    """Two busy loops of another program on a 2-core host: the ranks get a core about half the time they want one.

    The original report: cpu wait 41% and 37% in the table, and the only warning was "communication: compress
    gradients".  Allocation is the finding, it names a loop by pid and command line, as top shows it with `c`,
    and the exchange and a slow rank are its symptoms.
    """
    _, _, findings, summary = recorded("allocation_outside_programs")
    loops = {
        busy.pid
        for entry in recording.read(path_of("allocation_outside_programs"))
        if entry.kind == "host"
        for busy in entry.value.busy
        if busy.command and BUSY_LOOP in busy.command
    }
    assert len(loops) == 2, f"the recording saw the busy loops as {loops}"
    top = findings[0]
    assert top.cause == "allocation" and top.severity in ("warn", "critical"), summary
    assert any(f"busiest other: pid {pid} (" in top.title for pid in loops), summary
    assert f"-c {BUSY_LOOP}" in top.title, summary
    assert any(f"move or stop pid {pid}" in top.suggestion.lower() for pid in loops), summary
    assert all(f.severity == "info" for f in findings if f.cause in ("communication", "straggler")), summary


def test_a_small_gpt_at_batch_2_is_too_little_work_per_step_and_its_exchange_a_symptom() -> None:
    """A 2-block, 32-wide GPT over 192 characters at batch 2: 20-40-ms steps, a fifth of them in the exchange.

    Issue #35: read as communication (or, near its line, nothing) while the cause is the step: 140 KiB of
    gradients take the same time at any batch, and at batch 8 the forward and backward that grow with it
    would leave the exchange 6-8% of a step.
    """
    _, _, findings, summary = recorded("parallelism_small_gpt")
    top = findings[0]
    assert top.cause == "parallelism" and top.severity in ("warn", "critical") and top.ranks == (0, 1), summary
    assert "batch_size=8" in top.suggestion, summary
    assert all(f.severity == "info" for f in findings if f.cause == "communication"), summary


def test_find_unused_parameters_with_none_unused_is_read_from_ddp_itself() -> None:
    """DDP(find_unused_parameters=True) on a model that uses every parameter: a model_config warning."""
    snapshot, _, findings, summary = recorded("model_config_find_unused")
    (finding,) = [f for f in findings if f.cause == "model_config"]
    assert finding.severity == "warn" and "find_unused_parameters=True" in finding.title, summary
    for view in snapshot.all_ranks():
        assert view.hello.ddp_find_unused_parameters is True and view.hello.ddp_unused_parameter_bytes == 0
        assert view.hello.ddp_buckets and view.hello.ddp_gradient_bytes


def test_a_metric_after_the_optimizer_step_on_rank_1_is_a_straggler_outside_the_model() -> None:
    """Rank 1 computes a 30-ms Python metric after each optimizer step; rank 0 waits for it in the all-reduce.

    The step's own work is a few ms, so the others wait most of each step, far past the 10% line.  The phase
    named is the measured one, time outside the loader, forward, backward and comm, never the forward pass by
    elimination, and the stack samples name the function.
    """
    _, _, findings, summary = recorded("straggler_metric_after_step")
    top = findings[0]
    assert top.cause == "straggler" and top.severity in ("warn", "critical") and top.ranks == (1,), summary
    assert straggler_of(top).phase == "other", summary
    assert "outside loader, forward, backward, optimizer and comm" in top.title, summary
    assert "forward pass" not in top.title and "optimizer step takes" not in top.title, summary
    spends = re.search(r"; it spends \d+% of each step ([^;]*)", top.title)
    assert spends and "after the optimizer step" in spends[1], summary
    assert re.search(r"in `compute_metrics` \((tests/support/jobs/)?ddp_job\.py:\d+\)", spends[1]), summary
    # Chronic: rank 1 is late in every step by the metric's 30 ms, ten times the 5% line of a ~40-ms step.
    chronic = re.search(r"; it was the slowest in (\d+)% of the last (\d+) steps", top.title)
    assert chronic and int(chronic[1]) >= 80 and int(chronic[2]) >= 40, summary


def test_a_metric_on_a_rank_drawn_each_step_is_a_rotating_straggler_not_communication() -> None:
    """The same 30-ms metric, computed each step by a rank drawn at random: every rank waits in turn.

    By the ranks' means it is communication (exposed exchange ~40% on both ranks); step by step the rank the
    other waits for changes, each the slowest in about half the steps, and no one rank is blamed.
    """
    _, _, findings, summary = recorded("straggler_rotating")
    top = findings[0]
    assert top.cause == "straggler" and top.severity in ("warn", "critical") and top.ranks == (), summary
    assert straggler_of(top).rotating and top.title.startswith("the slowest rank rotates: rank "), summary
    shares = {rank: float(share) for rank, share in top.to_dict()["slowest"]["slowest_share"].items()}
    assert set(shares) == {"0", "1"} and all(0.25 < share < 0.75 for share in shares.values()), summary
    assert all(f.severity == "info" for f in findings if f.cause == "communication"), summary


def test_work_between_the_forward_and_backward_on_rank_1_is_outside_the_model_not_its_backward() -> None:
    """Rank 1 computes an 80-ms statistic of its outputs in Python between ``model(x)`` and ``loss.backward()``.

    Issue #45: DDP's logger starts its backward at the forward's end, so that work read as rank 1's "backward
    pass" with the fix "rank 1 computes slower than the others on its CPU cores", while its own stack samples
    put it between the forward pass and the optimizer step.  The reporter marks the backward's real start (an
    autograd pre-hook on the output's node) and takes the gap out of DDP's backward on the CPU: the work is
    time outside the phases, its place the script's function and line, and its fix the outside-the-model one.
    """
    _, figures, findings, summary = recorded("straggler_work_before_backward")
    slow = next(r for r in figures.all_ranks() if r.rank == 1)
    assert (slow.stats.phases.backward_s or 1.0) < 0.020 and (slow.stats.phases.other_s or 0.0) > 0.060, summary
    top = findings[0]
    assert top.cause == "straggler" and top.severity in ("warn", "critical") and top.ranks == (1,), summary
    assert straggler_of(top).phase == "other", summary
    assert "outside loader, forward, backward, optimizer and comm" in top.title, summary
    assert "backward pass" not in top.title, summary
    spends = re.search(r"; it spends \d+% of each step ([^;]*)", top.title)
    assert spends and spends[1].endswith("between the forward pass and the optimizer step"), summary
    assert re.search(r"in `loss_statistics` \((tests/support/jobs/)?ddp_job\.py:\d+\)", spends[1]), summary
    assert "extra work each step outside the model" in top.suggestion, top.suggestion
    assert "computes slower" not in top.suggestion, top.suggestion


def test_a_slow_optimizer_step_on_rank_1_is_named_as_the_phase_its_time_goes_to() -> None:
    """Rank 1's optimizer step does 30 ms of Python bookkeeping; the optimizer's own hooks time it.

    The phase is the measured optimizer step, not "outside the model": the figure users asked for, shown by
    every view through the one phase list (the report and the exporter too).
    """
    _, figures, findings, summary = recorded("straggler_slow_optimizer")
    optimizer_ms = {r.rank: 1e3 * (r.stats.phases.optimizer_s or 0.0) for r in figures.all_ranks()}
    assert optimizer_ms[1] > 25 and optimizer_ms[0] < 10, (optimizer_ms, summary)
    top = findings[0]
    assert top.cause == "straggler" and top.severity in ("warn", "critical") and top.ranks == (1,), summary
    assert straggler_of(top).phase == "optimizer", summary
    assert "more of each step than the others, in its optimizer step" in top.title, summary
    assert "optimizer step takes longer than the others'" in top.suggestion, top.suggestion
    entry = {r["rank"]: r for r in report.build(figures, list(findings))["runs"][0]["ranks"]}
    assert entry[1]["optimizer_ms"] == pytest.approx(optimizer_ms[1], abs=0.01), entry[1]
    exported = {
        (family.spec.name, labels[-1]): value
        for family in families(figures, list(findings), gpu_hostname="")
        if family.spec.name == "gputop_phase_seconds"
        for labels, value in family.samples
    }
    assert 1e3 * max(v for (_, phase), v in exported.items() if phase == "optimizer") > 25, exported


def test_a_checkpoint_every_10_steps_names_the_rank_that_stops_and_the_one_that_waits_and_no_rotation() -> None:
    """Rank 0 stops 400 ms after every 10th of 150 steps; rank 1 waits in the all-reduce: one culprit, one victim.

    Issue #35 saw "ranks 0, 1 stop 414 ms every 10 steps" beside "the slowest rank rotates: rank 1 in 31%, rank 0
    in 11%": the victim named as a culprit and the stops, counted step by step among jitter, read as a rotation.
    The 14 stops are ~15 ordinary steps each, ~60% of the run, far past the 20% critical line.  The stops are
    counted and timed too: each of the saves is in the stalls.
    """
    _, _, findings, summary = recorded("stall_checkpoint_every_10_rank0")
    top = findings[0]
    assert top.cause == "stall" and top.severity in ("warn", "critical") and top.ranks == (0,), summary
    stopped = re.search(r"^rank 0 stops (\d+) ms every 10 steps \((\d+) of 150\)", top.title)
    assert stopped, summary
    # 14 saves in 150 steps; DDP's first iteration (bucket rebuild) and a descheduled step can add more.
    stall_ms, count = int(stopped[1]), int(stopped[2])
    assert 14 <= count <= 30, summary
    assert count * stall_ms >= 0.95 * 14 * 400, summary  # the saves' 5.6 s are all in the stalls
    assert "outside the loader" in top.title, summary
    assert "rank 1 waits for it" in top.title and top.waiting_ranks == (1,), summary
    rotations = [f for f in findings if f.cause == "straggler" and straggler_of(f).rotating and f.severity != "info"]
    assert not rotations, summary
    assert all(f.severity == "info" for f in findings if f.cause in ("communication", "straggler")), summary


def compiled(name: str) -> tuple[tuple[Finding, ...], str]:
    _, figures, findings, summary = recorded(name)
    compiles = "; ".join(
        f"rank {r.rank}: {r.stats.compile.compiles} compiles, {r.stats.compile.recompiles} recompiles, "
        f"{r.stats.compile.seconds or 0:.1f} s compiling "
        f"({100 * (r.stats.compile.recompile_frac or 0):.0f}% of the run)"
        for r in figures.all_ranks()
    )
    return findings, f"{compiles}; {summary}"


def test_a_compiled_job_fed_four_sequence_lengths_gets_the_recompile_finding_on_top() -> None:
    """``dynamic=False`` and a new length every 4 steps: three recompiles, each far longer than the 48 steps.

    Each recompile takes 0.1-0.3 s with a warm inductor cache and 3-8 s with a cold one, against steps of a few
    ms: recompiling was 15% of a 60-step run at the least (a warm cache), 60% cold; asserted at twice the 5%
    warn line.
    """
    findings, summary = compiled("compile_four_lengths")
    top = next(f for f in findings if f.severity != "info" and f.cause != "allocation")
    assert top.cause == "recompile" and top.severity in ("warn", "critical"), summary
    assert top.magnitude > 2 * RECOMPILE_WARN_FRAC, summary
    assert "'forward' (compile_job.py:" in top.title and "3 times" in top.title, summary
    assert "size mismatch" in top.title and "dynamic=True" in top.suggestion, summary
    assert not any(f.cause == "stall" and f.severity != "info" for f in findings), summary


def test_a_steady_compiled_job_gets_no_recompile_or_stall_finding() -> None:
    """One length: one compile at the start, shown as compile time, no finding (0 recompiles, the line is 2)."""
    findings, summary = compiled("compile_steady")
    assert not any(f.cause in ("recompile", "stall") for f in findings), summary
    assert "0 recompiles" in summary and "1 compiles" in summary, summary


def test_an_fsdp2_rank_with_extra_work_each_step_is_named_the_straggler() -> None:
    """FSDP2 (fully_shard per block) where rank 1 does 80 ms of extra work each step: the others wait for it.

    Named by where its time goes, as under DDP: the others' waits in FSDP2's all-gathers and reduce-scatters are
    theirs, not time outside the model, and no one calls rank 0 slow.
    """
    _, _, findings, summary = recorded("fsdp2_straggler_extra_work_rank1")
    stragglers = [f for f in findings if f.cause == "straggler" and f.severity in ("warn", "critical")]
    assert stragglers and stragglers[0].ranks == (1,), summary
    assert "rank 1 is slow: it takes" in stragglers[0].title and "in `busy`" in stragglers[0].title, summary
    assert not any(f.cause == "straggler" and 0 in f.ranks for f in findings), summary
    # Step by step from each step's own work (issue #45: readiness read "the slowest in 2%"), and where rank 0 waits.
    slowest = stragglers[0].to_dict()["slowest"]
    assert slowest["from"] == "work" and float(slowest["slowest_share"]["1"]) >= 0.8, summary
    assert "in all_gather on dp above all" in stragglers[0].title, summary
    assert stragglers[0].to_dict()["waited_in"]["victims"] == [0], summary


def test_a_healthy_fsdp2_job_names_no_rank_the_slowest_in_most_steps() -> None:
    """The issue's FSDP2 job (4 blocks 192 wide, batch 32 of 16 tokens) with no extra work on either rank: the ranks'
    own work differs by noise from step to step, so most steps have no slowest rank, and no one rank is named."""
    _, figures, findings, summary = recorded("fsdp2_healthy")
    pattern = step_pattern(measured_ranks(figures.runs[0]))
    assert pattern is not None and pattern.by_work, summary
    assert pattern.decided_steps < 0.5 * pattern.steps and pattern.one_rank is None, (pattern.to_dict(), summary)
    assert not any(f.cause == "straggler" and f.severity != "info" for f in findings), summary


def test_an_accelerate_loop_waiting_on_its_data_is_named_loader_bound() -> None:
    """Accelerate's plain loop where one sample of each batch sleeps 80 ms against steps of ~20 ms.

    About four fifths of each step is waiting, through Accelerate's DataLoaderShard and its one batch ahead:
    data_loading is the top warning, on both ranks.
    """
    _, figures, findings, summary = recorded("accelerate_loader_bound")
    for rank in figures.all_ranks():
        assert rank.stats.phases.loader_wait_frac is not None and rank.stats.phases.loader_wait_frac > 0.5, summary
    top = findings[0]
    assert top.cause == "data_loading" and top.severity in ("warn", "critical"), summary
    assert set(top.ranks) == {0, 1}, summary


def test_symmetric_gradient_accumulation_names_no_slow_rank() -> None:
    """4 micro-batches under no_sync() per optimizer step on both ranks alike: no rank is slow.

    The original report: "straggler rank 1" in 1 of 3 runs of such a job.  Every rank does the same work; what
    differs window to window is noise, which the bands keep below a warning.  (The job makes its batches in the
    main process, 30% of its short steps: a data_loading finding is right.)
    """
    _, _, findings, summary = recorded("healthy_symmetric_accumulation")
    assert [f for f in findings if f.cause in ("straggler", "stall") and f.severity != "info"] == [], summary


# -- the bundled demos (`gputop demo --scenario X`) ------------------------------------------------

DEMO_CAUSE = {
    "slow_loader": "data_loading",
    "straggler": "straggler",
    "rotating": "straggler",
    "comm_bound": "communication",
    "small_batch": "parallelism",
    "oversubscribed": "allocation",
}


@pytest.mark.parametrize(("scenario", "cause"), sorted(DEMO_CAUSE.items()))
def test_each_demo_is_read_as_the_cause_it_reproduces(scenario: str, cause: str) -> None:
    _, _, findings, summary = recorded(f"demo_{scenario}")
    top = findings[0]
    assert top.cause == cause and top.severity in ("warn", "critical"), summary
    assert top.evidence and top.suggestion, summary
    if scenario == "straggler":  # named, with its own slow phase: only rank 1's input is slow
        assert top.ranks == (1,) and "waiting for its data" in top.title, summary
    if scenario == "rotating":  # a different rank each step: no one rank is blamed
        assert top.ranks == () and straggler_of(top).rotating, summary


def replay_live(name: str, *, alerts: AlertTracker | None = None, past_end_s: float = 0.0) -> Iterator[Refresh]:
    """The recording as a live view reads it: fed in at its own pace, a refresh every 0.5 s (the dashboard's).

    Each refresh is what the dashboard, `gputop record --on-finding` and the exporter compute from a live
    snapshot (``RefreshPipeline``: the span's figures, the persistent diagnoser, the alerts); ``past_end_s`` goes on
    refreshing after the last entry, as a live view does after a run has finished.
    """
    pipeline = RefreshPipeline(diagnoser=Diagnoser(), alerts=alerts)
    for t, store in recording.refreshes(path_of(name), settings.REFRESH_S.default, past_end_s=past_end_s):
        yield pipeline.update(store.snapshot(t, history=SPAN_COPY_WINDOWS))


def test_the_healthy_demos_first_minute_shows_no_warning_at_any_refresh_nor_in_its_report() -> None:
    """A newcomer's first screen: the healthy demo's minute, replayed refresh by refresh as the dashboard reads it.

    No warning or critical finding at any refresh, no straggler line of any severity (nothing calls a healthy
    rank slow), and the report of the whole run warns of nothing.
    """
    name = "demo_healthy_minute"
    shown = [
        f"{update.figures.t:.1f}: [{f.severity}] {f.cause}: {f.title}"
        for update in replay_live(name)
        for f in update.findings
        if f.severity in ("warn", "critical") or f.cause == "straggler"
    ]
    _, figures, findings, summary = recorded(name)
    stepped_s = [(r.stats.steps or 0) * (r.stats.step.mean_s or 0) for r in figures.all_ranks()]
    assert len(stepped_s) == 2 and min(stepped_s) > 55, summary  # both ranks stepped for the minute
    assert shown == [], f"shown live: {shown[:3]}; whole run: {summary}"
    assert [f for f in findings if f.severity != "info"] == [], summary


def test_on_finding_hears_of_a_finding_once_however_long_it_lasts_and_not_of_a_finished_run_clearing() -> None:
    """`record --on-finding` on the slow-loader demo (the alerts wait 2 s): raised once, with what a user acts on.

    A finished run keeps the diagnosis of its last span (the dashboard shows how it ended), so its findings do
    not clear when its ranks say bye: 20 s of refreshes after the run's end bring no second alert.  Clearing
    and worsening are tests/unit/test_alerts.py's.
    """
    alerts = [a for update in replay_live("demo_slow_loader", alerts=AlertTracker(hold_s=2.0), past_end_s=20.0)
              for a in update.alerts]  # fmt: skip
    said = [(a.kind, a.finding.cause, round(a.held_s, 1)) for a in alerts]
    loader = [a for a in alerts if a.finding.cause == "data_loading"]
    assert [a.kind for a in loader] == ["raised"], said
    assert loader[0].held_s >= 2 and loader[0].finding.severity in ("warn", "critical"), said
    assert loader[0].finding.evidence and loader[0].finding.suggestion, said
