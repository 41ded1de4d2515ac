"""A rank whose script raises says so in its bye; a rank killed with SIGKILL is lost (issue #48).

Real 2-rank DDP jobs on gloo, launched as srun launches them (``launch_ranks.py`` stops the others when one
dies, as torchrun does).
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from gputop.collect.server import Collector
from gputop.model.snapshot import DONE, LOST
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import launch, needs_torch

pytestmark = [pytest.mark.slow, needs_torch]

SHORT = {"GPUTOP_WINDOW_S": "0.25"}


def states(collector: Collector) -> dict[int, tuple[str, str]]:
    return {v.rank: (v.status, v.status_reason) for v in snapshot_of(collector).all_ranks()}


def test_a_rank_whose_script_raises_reads_failed_with_the_exception_not_lost(collector: Collector) -> None:
    job = launch("ddp_job.py", "--steps", "200", "--fail-at", "20", port=collector.address.port, env=SHORT)
    out, _ = job.communicate(timeout=120)
    assert job.returncode != 0, out[-2000:]
    failed = wait_for(lambda: states(collector).get(1, ("", ""))[0] == DONE, timeout_s=15)
    assert failed, f"{states(collector)}; the job printed:\n{out[-2000:]}"
    assert states(collector)[1] == (DONE, "failed: RuntimeError: rank 1 fails at step 20"), out[-2000:]


def test_a_rank_killed_with_sigkill_is_lost(collector: Collector) -> None:
    """SIGKILL leaves no bye: the rank is lost, its connection closed without one."""
    job = launch("ddp_job.py", "--steps", "1000000", port=collector.address.port, env=SHORT)
    stepping = wait_for(lambda: len([v for v in snapshot_of(collector).all_ranks() if v.windows]) == 2, timeout_s=60)
    if not stepping:
        job.kill()
        pytest.fail(f"the job never reported from both ranks: {job.communicate(timeout=30)[0][-2000:]}")
    (victim,) = [v for v in snapshot_of(collector).all_ranks() if v.rank == 1]
    assert victim.hello.pid is not None
    os.kill(victim.hello.pid, signal.SIGKILL)
    try:
        out, _ = job.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        job.kill()
        out, _ = job.communicate()
    lost = wait_for(lambda: states(collector).get(1, ("", ""))[0] == LOST, timeout_s=15)
    assert lost, f"{states(collector)}; the job printed:\n{out[-2000:]}"
    assert states(collector)[1] == (LOST, "connection closed"), out[-2000:]
