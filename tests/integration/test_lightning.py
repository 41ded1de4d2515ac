"""A real 2-process Lightning DDP run reports through GputopCallback."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys

import pytest

from gputop.model.sums import rank_stats
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import JOBS, finish

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning is not installed"),
]


def test_lightning_ddp_ranks_report_steps_ddp_stats_and_loader_wait(collector, tmp_path) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(JOBS / "lightning_job.py"), "40", str(tmp_path)],
        env={**os.environ, "GPUTOP_PORT": str(collector.address.port), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    finish(proc, timeout_s=180)
    assert wait_for(lambda: [v.status for v in snapshot_of(collector).all_ranks()] == ["done", "done"])
    (run,) = snapshot_of(collector).runs
    assert run.world_size == 2
    for view in run.ranks:
        stats = rank_stats(view.windows)
        assert stats.steps == 40
        assert view.hello.ddp is True and view.hello.loader_batch_size == 8
        assert stats.phases.comm_s is not None and stats.phases.comm_s > 0
        assert stats.phases.loader_wait_s is not None and stats.phases.loader_wait_s >= 0.008
        # Validation (4 batches x 200 ms every 10 steps = 80 ms a step) is not counted as waiting for data.
        assert stats.phases.loader_wait_s < 0.05
    # The breakdown went into the trainer's logger (CSV here), every log_every_n_steps, beside the loss.
    (metrics,) = tmp_path.rglob("metrics.csv")
    rows = list(csv.DictReader(metrics.open()))
    logged = [float(r["gputop/rank0/loader_wait_pct"]) for r in rows if r.get("gputop/rank0/loader_wait_pct")]
    assert len(logged) >= 5 and all(0 < v <= 100 for v in logged), rows[:3]
    assert {int(r["step"]) for r in rows if r.get("gputop/rank0/step_time_ms")} <= set(range(0, 41, 5))
