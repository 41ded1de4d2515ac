"""Real 2-rank DDP (gloo) jobs reporting to a real collector."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import msgspec
import pytest

from gputop.address import Address
from gputop.collect import recording
from gputop.collect.server import Collector
from gputop.collect.store import Store
from gputop.model.snapshot import DONE
from gputop.model.sums import rank_stats
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import finish, launch, needs_torch

pytestmark = [pytest.mark.slow, needs_torch]


# Windows of a quarter second: these jobs last a second or two, and what is checked is how windows split and
# account for steps (several of them, without gaps), which holds at any window length.
SHORT = {"GPUTOP_WINDOW_S": "0.25"}


def _all_done(collector: Collector, ranks: int = 2) -> bool:
    views = snapshot_of(collector).all_ranks()
    return len(views) == ranks and all(v.status == DONE for v in views)


def test_both_ranks_report_exact_steps_loader_wait_and_ddp_comm(collector: Collector) -> None:
    """Steps equal what the script ran; a 20 ms per-batch dataset shows >= 15 ms of loader wait per step."""
    out = finish(launch("ddp_job.py", "--steps", "40", "--delay-ms", "20", port=collector.address.port, env=SHORT))
    assert "rank 0 steps 40" in out and "rank 1 steps 40" in out
    assert wait_for(lambda: _all_done(collector))
    (run,) = snapshot_of(collector).runs
    assert run.world_size == 2
    assert [v.rank for v in run.ranks] == [0, 1]
    for view in run.ranks:
        stats = rank_stats(view.windows)
        assert stats.steps == 40
        assert stats.phases.loader_wait_s is not None and stats.phases.loader_wait_s >= 0.015
        assert stats.phases.comm_s is not None and stats.phases.comm_s > 0
        assert stats.phases.forward_s is not None and stats.phases.backward_s is not None
        assert view.hello.backend == "gloo"
        assert view.hello.ddp is True
        assert view.hello.loader_batch_size == 8 and view.hello.loader_num_workers == 0
        # gputop accounts for itself; how much is the benchmarks' business, that it is measured is ours.
        assert stats.cost.reporter_cpu_pct is not None and stats.cost.reporter_cpu_pct > 0
        assert stats.cost.hook_s_per_step is not None and 0 < stats.cost.hook_s_per_step < (stats.step.mean_s or 0)
        assert stats.cost.cpu_frac is not None and 0 < stats.cost.cpu_frac < 1
        assert stats.cost.sent_bytes_per_s is not None and stats.cost.sent_bytes_per_s > 0
        # The work a step does (docs/mfu.md), counted as by hand, and the CPU's peak the rank measured once.
        assert stats.work.flops_per_step == ddp_job_flops(batch=8), stats.work.flops_per_step
        assert view.hello.cpu_peak_flops is not None and view.hello.cpu_peak_flops > 1e8


def ddp_job_flops(batch: int) -> int:
    """ddp_job.py's model at --hidden 128: forward 2·B·in·out a Linear, backward twice that, less the first
    Linear's input gradient (the batch needs none)."""
    forward = 2 * batch * 64 * 128 + 2 * batch * 128 * 10
    return 3 * forward - 2 * batch * 64 * 128


@pytest.mark.parametrize("accumulate", [1, 3], ids=["every-step", "no_sync-accumulation"])
def test_ddp_timings_cover_every_iteration_once_and_match_ddps_own_average(
    collector: Collector, accumulate: int
) -> None:
    """On the CPU DDP times every iteration; the windows split them without gaps or overlaps.

    Under gradient accumulation DDP counts only the synchronising micro-batches,
    one per optimizer step, and gputop's steps still count optimizer steps.
    """
    steps = 120 // accumulate
    args = ("--steps", str(steps), "--delay-ms", "10", "--accumulate", str(accumulate))
    out = finish(launch("ddp_job.py", *args, port=collector.address.port, env=SHORT))
    assert wait_for(lambda: _all_done(collector))
    (run,) = snapshot_of(collector).runs
    for view in run.ranks:
        assert rank_stats(view.windows).steps == steps
        iteration, average_ns = re.search(rf"rank {view.rank} ddp (\d+) (\d+)", out).groups()  # type: ignore[union-attr]
        timed = [w for w in view.windows if w.ddp_steps]
        assert len(timed) >= 3, "the job spans several windows"
        assert sum(w.ddp_steps or 0 for w in timed) == int(iteration)
        mean_s = sum((w.forward_s or 0.0) * (w.ddp_steps or 0) for w in timed) / int(iteration)
        assert mean_s == pytest.approx(int(average_ns) / 1e9, rel=1e-3)


@pytest.mark.parametrize("order", ["before", "after"])
def test_manual_marks_beside_the_optimizer_hook_count_each_step_once(collector: Collector, order: str) -> None:
    """gputop.step() before or after optimizer.step(), from the first step on: 40 steps are 40, not 41."""
    out = finish(launch("ddp_job.py", "--steps", "40", "--manual", order, port=collector.address.port))
    assert "rank 1 steps 40" in out
    assert wait_for(lambda: _all_done(collector))
    counted = {
        v.rank: (rank_stats(v.windows).steps, v.windows[-1].step_total) for v in snapshot_of(collector).all_ranks()
    }
    assert counted == {0: (40, 40), 1: (40, 40)}, (
        f"gputop.step() {order} optimizer.step(): (steps, step_total) {counted}"
    )


def test_collector_started_late_still_counts_every_step() -> None:
    """The reporter's backlog carries the steps made before any dashboard listened."""
    probe = Collector(Store(), Address(port=0))
    probe.start()
    port = probe.address.port
    assert port is not None
    probe.stop()  # keep the port number, free the port: the job starts with nobody listening

    job = launch("ddp_job.py", "--steps", "150", "--delay-ms", "20", port=port)
    time.sleep(3.0)
    late = Collector(Store(), Address(port=port))
    late.start()
    try:
        finish(job)
        assert wait_for(lambda: _all_done(late))
        for view in snapshot_of(late).all_ranks():
            first = view.windows[0]
            assert first.seq == 1, "the backlog starts at the run's first window"
            assert rank_stats(view.windows).steps == 150
    finally:
        late.stop()


def test_recorder_killed_and_restarted_mid_run_job_exits_zero(tmp_path) -> None:
    """Killing the dashboard side never hurts training, and the killed recording stays readable."""
    probe = Collector(Store(), Address(port=0))
    probe.start()
    port = probe.address.port
    probe.stop()

    def record(path):
        return subprocess.Popen(
            [sys.executable, "-m", "gputop", "record", "--port", str(port), "--seconds", "60", "-o", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    recorder = record(first)
    job = launch("ddp_job.py", "--steps", "250", "--delay-ms", "20", port=port)
    assert wait_for(lambda: first.exists() and first.read_text().count('"type":"window"') >= 4, timeout_s=60)
    recorder.send_signal(signal.SIGKILL)
    recorder.wait()
    recorder = record(second)
    try:
        out = finish(job)
        assert "rank 0 steps 250" in out and "rank 1 steps 250" in out
        assert wait_for(lambda: second.read_text().count('"type":"bye"') == 2, timeout_s=20)
    finally:
        recorder.send_signal(signal.SIGTERM)  # a background job's SIGINT may be ignored; SIGTERM never is
        recorder.wait(10)

    store, last_t = recording.load(first)  # the killed one: every complete line reads back
    assert {v.rank for v in store.snapshot(last_t).all_ranks()} == {0, 1}
    store, last_t = recording.load(second)
    for view in store.snapshot(last_t).all_ranks():
        assert view.status == DONE
        assert view.windows[-1].step_total == 250


def test_watching_costs_nothing_when_disabled(collector: Collector) -> None:
    """GPUTOP_DISABLE=1 makes watch/track no-ops: the job runs and nothing connects."""
    out = finish(launch("ddp_job.py", "--steps", "10", port=collector.address.port, env={"GPUTOP_DISABLE": "1"}))
    assert "rank 1 steps 10" in out
    time.sleep(0.5)
    assert snapshot_of(collector).runs == ()


def test_dataloader_workers_never_report(collector: Collector) -> None:
    """Forked DataLoader workers inherit the reporter but stay silent; the ranks report them and their CPU."""
    # ~2 s of loader-bound steps: several windows close while the (per-epoch) workers are alive.
    # At 150 × 5 ms the job ended within one window and a slow start could miss the workers entirely.
    finish(launch("ddp_job.py", "--steps", "200", "--delay-ms", "20", "--workers", "2", port=collector.address.port))
    assert wait_for(lambda: _all_done(collector))
    views = snapshot_of(collector).all_ranks()
    assert sorted(v.hello.pid for v in views) == sorted({v.hello.pid for v in views})
    assert len(views) == 2
    for view in views:
        assert view.hello.loader_num_workers == 2
        seen = [(w.workers, w.workers_cpu_pct) for w in view.windows]
        assert any(n == 2 and cpu is not None for n, cpu in seen), f"rank {view.rank}: (workers, their CPU%) {seen}"


def test_gradient_accumulation_accounts_for_every_micro_batch(collector: Collector) -> None:
    """4 micro-batches per optimizer step under no_sync(): DDP times one; the step's phases count all four."""
    finish(
        launch("ddp_job.py", "--steps", "40", "--accumulate", "4", "--batch-size", "64", port=collector.address.port)
    )
    assert wait_for(lambda: _all_done(collector))
    for view in snapshot_of(collector).runs[0].ranks:
        stats = rank_stats(view.windows)
        # The same windows without the forward count: DDP's one timed micro-batch per step, as before.
        one = rank_stats([msgspec.structs.replace(w, forwards=None) for w in view.windows])
        micro = stats.phases.micro_batches
        assert micro == pytest.approx(4.0, rel=0.05), f"rank {view.rank}: {micro}"
        assert one.phases.micro_batches is None and one.phases.forward_s and one.phases.backward_s
        assert stats.phases.forward_s == pytest.approx(stats.phases.micro_batches * one.phases.forward_s)
        assert stats.phases.backward_s == pytest.approx(stats.phases.micro_batches * one.phases.backward_s)
        assert stats.phases.comm_s == one.phases.comm_s  # one all-reduce per step either way
        assert stats.work.flops_per_step == 4 * ddp_job_flops(batch=64)  # the step's four micro-batches


GRADIENT_BYTES = 4 * (64 * 128 + 128 + 128 * 10 + 10)  # ddp_job.py's model at --hidden 128, float32


@pytest.mark.parametrize("flag", ["--loss-all-reduce", "--comm-hook"])
def test_the_gradient_exchange_is_counted_once_beside_the_scripts_own_all_reduces(
    collector: Collector, flag: str
) -> None:
    """DDP's exchange is its row in the collectives, however the script all-reduces beside it.

    ``--loss-all-reduce``: the script averages its loss each step (4 bytes); the tap times that, DDP's reducer
    all-reduces the gradients in C++ out of its sight, and the row holds both (it held only the loss's once:
    an all-reduce seen on the group was taken for a comm hook's).  ``--comm-hook``: torch's Python
    ``allreduce_hook`` all-reduces the gradients where the tap sees it, and DDP's row would count them twice.
    """
    # ~2 s of steps: the tap times collectives once the collector has answered (from the reporter's first tick).
    finish(launch("ddp_job.py", "--steps", "150", "--delay-ms", "10", flag, port=collector.address.port))
    assert wait_for(lambda: _all_done(collector))
    for view in snapshot_of(collector).all_ranks():
        stats = rank_stats(view.windows)
        rows = [c for c in stats.collectives if c.kind == "all_reduce" and c.group == "world"]
        seen = [c.to_dict() for c in stats.collectives]
        assert len(rows) == 1, seen
        # Every step's gradients, once (the first windows, before DDP has said how it is built, may add a little).
        assert GRADIENT_BYTES <= rows[0].bytes < 1.5 * GRADIENT_BYTES, (GRADIENT_BYTES, seen)
        assert rows[0].ranks == 2 and rows[0].bandwidth is not None, seen  # DDP's row has its bus bandwidth too
        if flag == "--loss-all-reduce":
            assert rows[0].calls >= 1.5, seen  # a bucket's each step, and the loss's once the tap is on
