"""The reporter in real training scripts: steps and samples counted, manual marks, silence without a dashboard."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import JOBS, finish, needs_torch, run_script


@needs_torch
def test_a_single_process_without_ddp_reports_steps_and_samples(collector) -> None:
    code = """
        import torch, gputop
        model = torch.nn.Linear(4, 2)
        gputop.watch(model)
        gputop.watch(model)  # twice is harmless
        opt = torch.optim.Adam(model.parameters())
        other = torch.optim.SGD(model.parameters(), lr=0.1)  # a second optimizer must not double the steps
        loader = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=4)
        for x in gputop.track(loader):
            model(x).sum().backward()
            opt.step(); other.step(); opt.zero_grad()
    """
    result = run_script(code, collector.address.port)
    assert result.returncode == 0, result.stderr
    assert wait_for(lambda: any(v.status == "done" for v in snapshot_of(collector).all_ranks()))
    (view,) = snapshot_of(collector).all_ranks()
    assert view.hello.world_size == 1 and view.hello.ddp is False and view.hello.device == "cpu"
    assert view.windows[-1].step_total == 16
    assert sum(w.samples or 0 for w in view.windows) == 64
    assert all(w.comm_s is None for w in view.windows)  # not DDP: N/A, not zero


@needs_torch
@pytest.mark.alone  # a verdict (or a time) read on a job run now: nothing beside it (__init__.py)
def test_each_step_says_when_its_last_training_forward_ended_how_long_it_took_and_how_large_its_input_was(
    collector,
) -> None:
    """20 ms of work before a 10-ms forward is in the step's readiness; an evaluation forward after it is not.

    The forward's own length goes beside it, and its input's size: what of the readiness is the step's work
    and whether it follows the data (issue #35's rotation of uneven batches is read from them), and what came
    before.  The input is found whether passed by position or by keyword (``model(**batch)``).
    """
    code = """
        import time, torch, gputop

        class Slow(torch.nn.Linear):
            def forward(self, input):
                time.sleep(0.01)  # a forward of 10 ms
                return super().forward(input)

        model = Slow(4, 2)
        gputop.watch(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(12):
            time.sleep(0.02)  # a metric, a log line: before this step's forward
            x = torch.randn(1 + i, 4)  # a batch of 1 + i rows: 4 + 4i elements
            (model(x) if i % 2 else model(input=x)).sum().backward()
            time.sleep(0.03)
            with torch.no_grad():
                model(torch.randn(50, 4))  # evaluation: the rank was ready 30 ms before it
            opt.step()
    """
    assert run_script(code, collector.address.port).returncode == 0
    assert wait_for(lambda: any(v.status == "done" for v in snapshot_of(collector).all_ranks()))
    (view,) = snapshot_of(collector).all_ranks()
    ready = dict(pair for w in view.windows for pair in zip(w.ready_step_numbers, w.ready_s, strict=True))
    assert sorted(ready) == list(range(2, 13))  # the first step has no start: its readiness is unknown
    assert all(0.029 < seconds < 0.060 for seconds in ready.values()), ready
    forwards = dict(pair for w in view.windows for pair in zip(w.ready_step_numbers, w.ready_forward_s, strict=True))
    assert sorted(forwards) == sorted(ready), forwards  # every step's, the training forward's, not the evaluation's
    assert all(0.0095 < forwards[n] < ready[n] - 0.019 for n in ready), (forwards, ready)
    sizes = dict(pair for w in view.windows for pair in zip(w.ready_step_numbers, w.ready_input_numel, strict=True))
    assert sizes == {n: 4 * n for n in ready}, sizes  # step n trained on n rows, by position or by keyword


@needs_torch
def test_manual_step_marks_replace_optimizer_steps(collector) -> None:
    code = """
        import torch, gputop
        model = torch.nn.Linear(4, 2)
        gputop.watch(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(10):
            for micro in range(3):
                model(torch.randn(2, 4)).sum().backward()
                gputop.step()
            opt.step()
    """
    assert run_script(code, collector.address.port).returncode == 0
    assert wait_for(lambda: any(v.status == "done" for v in snapshot_of(collector).all_ranks()))
    assert snapshot_of(collector).all_ranks()[0].windows[-1].step_total == 30


@needs_torch
def test_a_manual_mark_after_the_optimizer_step_closes_the_same_step(collector) -> None:
    """The hook counts the first step before gputop.step() is ever called; the switch must not add one."""
    code = """
        import torch, gputop
        model = torch.nn.Linear(4, 2)
        gputop.watch(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(10):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            gputop.step()
    """
    assert run_script(code, collector.address.port).returncode == 0
    assert wait_for(lambda: any(v.status == "done" for v in snapshot_of(collector).all_ranks()))
    assert snapshot_of(collector).all_ranks()[0].windows[-1].step_total == 10


@needs_torch
def test_no_dashboard_costs_the_script_nothing_visible() -> None:
    """Nobody listens: no output, no error, a normal exit, and exit is not held up."""
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    code = """
        import torch, gputop, time
        model = torch.nn.Linear(4, 2)
        gputop.watch(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in gputop.track([torch.randn(2, 4)] * 50):
            model(x).sum().backward(); opt.step()
        t = time.monotonic()
        print("ok")
    """
    result = run_script(code, port)
    assert result.returncode == 0
    assert result.stdout.strip() == "ok"
    assert "gputop" not in result.stderr


@needs_torch
@pytest.mark.slow
def test_mp_spawn_ranks_report_as_one_run_and_flush_at_exit(collector) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    master_port = probe.getsockname()[1]
    probe.close()
    proc = subprocess.Popen(
        [sys.executable, str(JOBS / "spawn_job.py"), str(master_port), "25"],
        env={**os.environ, "GPUTOP_PORT": str(collector.address.port)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    finish(proc)
    assert wait_for(lambda: [v.status for v in snapshot_of(collector).all_ranks()] == ["done", "done"])
    (run,) = snapshot_of(collector).runs
    assert [v.rank for v in run.ranks] == [0, 1]
    assert all(v.windows[-1].step_total == 25 for v in run.ranks)
