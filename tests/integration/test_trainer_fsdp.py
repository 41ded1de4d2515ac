"""The Hugging Face Trainer asked for FSDP on CPU: what runs is DDP, and gputop reports DDP.

Accelerate (1.15) enables its FSDP plugin only for accelerator devices (MULTI_GPU, MULTI_XPU, …);
with ``use_cpu=True`` the state is MULTI_CPU and ``fsdp="full_shard"`` is dropped without a word,
so the Trainer wraps the model in DDP.  gputop must say what ran, not what was asked for.  Should a
later Accelerate shard on CPU, this test fails and the Trainer's FSDP needs checking against
tests/integration/test_fsdp2.py's expectations.
"""

from __future__ import annotations

import importlib.util

import pytest

from gputop.model.sums import rank_stats
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import finish, launch, needs_torch

pytestmark = [
    pytest.mark.slow,
    needs_torch,
    pytest.mark.skipif(
        importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None,
        reason="transformers/accelerate not installed (make test installs them)",
    ),
]


def test_trainer_asked_for_fsdp_on_cpu_runs_ddp_and_reports_ddp(collector, tmp_path) -> None:
    steps = 30
    out = finish(launch("hf_trainer_fsdp_job.py", str(steps), str(tmp_path), port=collector.address.port), 300)
    assert "rank 0 fsdp enabled False wrapped in DistributedDataParallel" in out, out[-2000:]
    assert wait_for(lambda: all(v.status == "done" for v in snapshot_of(collector).all_ranks()))
    ranks = snapshot_of(collector).all_ranks()
    assert [v.rank for v in ranks] == [0, 1]
    for view in ranks:
        stats = rank_stats(view.windows)
        measured = (
            f"rank {view.rank}: ddp {view.hello.ddp}, {stats.steps} steps, phases from {stats.phases.source}, "
            f"fwd {stats.phases.forward_s}, bwd {stats.phases.backward_s}, comm {stats.phases.comm_s}, "
            f"loader {stats.phases.loader_wait_s}"
        )
        assert view.hello.ddp is True and view.hello.backend == "gloo", measured
        assert stats.steps == steps and stats.phases.source == "ddp", measured
        assert stats.phases.comm_s is not None and stats.phases.comm_s > 0, measured
        assert stats.phases.loader_wait_s is not None and stats.phases.loader_wait_s > 0.005, measured
