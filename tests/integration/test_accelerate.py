"""A plain Accelerate loop (``accelerator.prepare``) on 2 CPU processes reports like a torchrun DDP job.

The job (tests/support/jobs/accelerate_job.py) is written as Accelerate's ``nlp_example.py`` is,
with ``gputop.watch(model)`` after ``prepare`` and ``gputop.track`` on the prepared loader.
With no GPU, ``Accelerator(cpu=True)`` under torchrun picks MULTI_CPU and gloo and wraps the
model in DDP, so DDP's logger times forward, backward and the exchange as in a torchrun job.
"""

from __future__ import annotations

import importlib.util

import pytest

from gputop.collect.server import Collector
from gputop.model.figures import Figures, summarize
from gputop.model.snapshot import DONE
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import finish, launch, needs_torch

pytestmark = [
    pytest.mark.slow,
    needs_torch,
    pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="accelerate is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed"),
]


def run_accelerate_job(collector: Collector, *args: str) -> tuple[Figures, str]:
    """Run accelerate_job.py with ``args`` to its end; the whole run's figures and what the job printed."""
    out = finish(launch("accelerate_job.py", "--cpu", *args, port=collector.address.port), timeout_s=180)
    assert wait_for(lambda: [v.status for v in snapshot_of(collector).all_ranks()] == [DONE, DONE], timeout_s=30), out
    return summarize(snapshot_of(collector), span_s=None), out


def measured(figures: Figures) -> str:
    """Each rank's figures as the assertions read them, for their messages."""
    return "; ".join(
        f"rank {r.rank}: {r.stats.steps} steps of {1e3 * (r.stats.step.mean_s or 0):.1f} ms, "
        f"loader {1e3 * (r.stats.phases.loader_wait_s or 0):.1f} ms "
        f"({100 * (r.stats.phases.loader_wait_frac or 0):.0f}%), "
        f"forward {r.stats.phases.forward_s}, backward {r.stats.phases.backward_s}, comm {r.stats.phases.comm_s}, "
        f"exposed comm {r.stats.phases.exposed_comm_s} ({100 * (r.stats.phases.exposed_comm_frac or 0):.0f}%), "
        f"from {r.stats.phases.source}"
        for r in figures.all_ranks()
    )


def test_an_accelerate_loop_reports_both_ranks_steps_loader_wait_and_ddp_phases(collector: Collector) -> None:
    """60 steps, one sample of each batch sleeping 5 ms: every figure a torchrun DDP job has is there."""
    figures, out = run_accelerate_job(collector, "--steps", "60", "--delay-ms", "5")
    # What Accelerate made of it, as the job saw it: distributed on the CPU, the model wrapped in DDP.
    assert out.count("DistributedType.MULTI_CPU DistributedDataParallel") == 2, out[-2000:]
    (run,) = figures.runs
    summary = measured(figures)
    assert run.world_size == 2 and [r.rank for r in run.ranks] == [0, 1], summary
    for view in snapshot_of(collector).all_ranks():
        assert view.hello.ddp is True and view.hello.backend == "gloo", view.hello
    for rank in run.ranks:
        stats = rank.stats
        assert stats.steps == 60, summary
        # Each batch waits for its 5-ms sample, through Accelerate's DataLoaderShard and its one batch ahead.
        assert stats.phases.loader_wait_s is not None and stats.phases.loader_wait_s >= 0.004, summary
        assert stats.phases.source == "ddp", summary  # DDP's logger, as in a torchrun job
        assert stats.phases.forward_s is not None and stats.phases.forward_s > 0, summary
        assert stats.phases.backward_s is not None and stats.phases.backward_s > 0, summary
        assert stats.phases.comm_s is not None and stats.phases.comm_s > 0, summary
        assert stats.phases.exposed_comm_s is not None and stats.phases.exposed_comm_frac is not None, summary
        # AcceleratedOptimizer's inner step:
        assert stats.phases.optimizer_s is not None and stats.phases.optimizer_s > 0, summary
