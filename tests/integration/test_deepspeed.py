"""A DeepSpeed ZeRO loop on 2 CPU processes (gloo), where DeepSpeed is installed: steps, loader wait and
each collective ZeRO issues, through deepspeed.comm to torch.distributed.

DeepSpeed is not among gputop's dependencies and `make test` does not install it: its first start
builds a C++ op with ninja (~100 s on two cores here), past what the suite can spend. Run it where
DeepSpeed is (`pip install torch==2.13.0 deepspeed` in a venv with gputop's dependencies) with
`python -m pytest tests/integration/test_deepspeed.py`; docs/communication.md has its figures.
"""

from __future__ import annotations

import importlib.util

import pytest

from gputop.collect.server import Collector
from gputop.model.figures import summarize
from gputop.model.snapshot import DONE
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import finish, launch, needs_torch

pytestmark = [
    pytest.mark.slow,
    needs_torch,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="deepspeed is not installed (make test leaves it out: its first start compiles a C++ op, ~100 s)",
    ),
]


@pytest.mark.parametrize("stage", [1, 2])
def test_a_zero_engine_reports_steps_loader_wait_and_its_collectives(collector: Collector, stage: int) -> None:
    finish(launch("deepspeed_job.py", "--steps", "40", "--stage", str(stage), "--delay-ms", "5",
                    port=collector.address.port), timeout_s=300)  # fmt: skip
    assert wait_for(lambda: [v.status for v in snapshot_of(collector).all_ranks()] == [DONE, DONE], timeout_s=30)
    figures = summarize(snapshot_of(collector), span_s=None)
    for rank in figures.all_ranks():
        s = rank.stats
        kinds = {c.kind for c in s.collectives}
        summary = f"rank {rank.rank}: {s.steps} steps, loader {s.phases.loader_wait_s}, collectives {s.collectives}"
        assert s.steps == 40 and s.phases.loader_wait_s is not None and s.phases.loader_wait_s >= 0.004, summary
        assert s.phases.source == "hooks" and s.phases.forward_s and s.phases.exposed_comm_s is not None, summary
        assert "all_reduce" in kinds or "reduce_scatter" in kinds, summary  # ZeRO's gradient reduction
        assert all(c.exposed_s is not None and (c.bytes > 0 or c.kind == "barrier") for c in s.collectives), summary
