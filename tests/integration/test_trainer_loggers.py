"""The Hugging Face Trainer callback and gputop's figures in the trainer's logger, on real runs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gputop.protocol import FindingBrief
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import finish, needs_torch, torchrun

needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None,
    reason="transformers/accelerate not installed (make test installs them)",
)
needs_tensorboard = pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="no tensorboard")


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files under ``log_dir``: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, list[tuple[int, float]]] = {}
    for events in log_dir.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            found.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return found


@needs_torch
@needs_transformers
@needs_tensorboard
@pytest.mark.slow
def test_trainer_ddp_ranks_report_like_torchrun_and_log_next_to_the_loss(collector, tmp_path) -> None:
    steps = 60
    out = finish(torchrun("hf_trainer_job.py", str(steps), str(tmp_path), port=collector.address.port), 300)
    assert "rank 0 done" in out and "rank 1 done" in out
    assert wait_for(lambda: all(v.status == "done" for v in snapshot_of(collector).all_ranks()))
    ranks = snapshot_of(collector).all_ranks()
    assert [v.rank for v in ranks] == [0, 1] and len({v.run_id for v in ranks}) == 1
    for view in ranks:
        assert view.hello.ddp is True and view.hello.model_name == "Tiny" and view.hello.backend == "gloo"
        assert view.hello.loader_batch_size == 8
        assert view.windows[-1].step_total == steps
        # DDP's own timings were read from the wrapper Accelerate made.
        assert any(w.comm_s is not None for w in view.windows)
        # A 10-ms sample in every batch of 8: each step waits ~10 ms for data.
        wait_s = sum(w.loader_wait_s for w in view.windows)
        assert wait_s > 0.5 * 0.010 * (steps - 1), f"rank {view.rank} waited {wait_s:.3f} s for {steps} steps"
    logged = scalars(tmp_path / "tb")
    assert "train/loss" in logged, sorted(logged)
    loader = logged.get("train/gputop/rank0/loader_wait_pct")
    assert loader, f"no gputop figures beside the loss: {sorted(logged)}"
    assert all(0 < value <= 100 for _, value in loader)
    assert {step for step, _ in loader} <= {step for step, _ in logged["train/loss"]}  # logged at the loss's steps
    assert "train/gputop/rank0/exposed_comm_ms" in logged
    assert "train/gputop/rank0/optimizer_ms" in logged  # the optimizer's own hooks time its step
    mfu = logged.get("train/gputop/rank0/mfu_pct")  # the work a step does, against the CPU's measured peak
    assert mfu and all(0 < value < 100 for _, value in mfu), sorted(logged)


@needs_torch
@needs_tensorboard
def test_log_to_writes_the_breakdown_and_the_runs_findings_into_a_summary_writer(collector, tmp_path) -> None:
    # The job's writer is a SummaryWriter seen through a tee, which says (in a file) when the finding was written:
    # the dashboard's clear is sent only after that, and the job ends once the clear is written too; no race with
    # the reporter's 1-s windows on a loaded machine.
    code = f"""
        import pathlib, time, torch, gputop
        from torch.utils.tensorboard import SummaryWriter

        class Tee:
            def __init__(self, writer):
                self.writer, self.cleared = writer, False
            def add_scalar(self, tag, value, global_step=None):
                self.writer.add_scalar(tag, value, global_step=global_step)
                if tag == "gputop/finding/data_loading":
                    pathlib.Path({str(tmp_path / "warned")!r}).touch()
                    self.cleared = value == 0.0
            def add_text(self, tag, text, global_step=None):
                self.writer.add_text(tag, text, global_step=global_step)

        writer = SummaryWriter({str(tmp_path / "tb")!r})
        tee = Tee(writer)
        model = torch.nn.Linear(16, 4)
        gputop.watch(model)
        gputop.log_to(tee, every_s=0.5)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(torch.randn(400000, 16), batch_size=8)
        deadline = time.monotonic() + 100
        for i, x in enumerate(gputop.track(loader)):
            time.sleep(0.004)  # the step's own work
            loss = model(x).pow(2).mean()
            loss.backward(); opt.step(); opt.zero_grad()
            writer.add_scalar("loss", loss.item(), i + 1)
            if tee.cleared or time.monotonic() > deadline:
                break
        writer.close()
    """
    env = {**os.environ, "GPUTOP_PORT": str(collector.address.port)}
    job = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, stderr=subprocess.PIPE, text=True)
    try:
        # Once the job is stepping, so every figure it writes from here has steps behind it.
        ranks = lambda: snapshot_of(collector).all_ranks()  # noqa: E731
        assert wait_for(lambda: any(v.windows and v.windows[-1].step_total >= 20 for v in ranks()), timeout_s=90)
        (view,) = snapshot_of(collector).all_ranks()
        # What a dashboard does when its findings for the run change: tell the run's ranks.
        shown = (FindingBrief(cause="data_loading", severity="warn", title="rank 0 waits for data 42%", ranks=(0,)),)
        collector.notify_findings(view.run_id, shown)
        assert wait_for(lambda: (tmp_path / "warned").exists(), timeout_s=60), "the finding was never written"
        collector.notify_findings(view.run_id, ())  # it cleared
        _, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 0, err
    logged = scalars(tmp_path / "tb")
    assert "loss" in logged
    steps = logged.get("gputop/rank0/step_time_ms")
    assert steps, f"nothing from gputop in {sorted(logged)}"
    # At the rank's step count, so the breakdown lines up with the loss.
    last_step = max(s for s, _ in logged["loss"])
    assert max(s for s, _ in steps) <= last_step and all(value >= 4.0 for _, value in steps), steps
    assert "gputop/rank0/loader_wait_pct" in logged and "gputop/rank0/steps_per_s" in logged
    assert "gputop/rank0/tflops" in logged and "gputop/rank0/gflop_per_step" in logged, sorted(logged)
    finding = [value for _, value in logged["gputop/finding/data_loading"]]
    assert 2.0 in finding and finding[-1] == 0.0, finding  # warn while shown, 0 once cleared
