"""A job ended by SIGTERM says so in each rank's bye; a rank killed with SIGKILL is the only one lost (issue #48).

Real 2-rank DDP jobs on gloo, launched as srun launches them (``launch_ranks.py`` passes SIGTERM to every
rank, and stops the others when one dies, as torchrun does).
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


def running_job(collector: Collector) -> subprocess.Popen[str]:
    """A DDP job with steps to spare, once both its ranks have sent a window."""
    job = launch("ddp_job.py", "--steps", "1000000", port=collector.address.port, env=SHORT)
    stepping = wait_for(lambda: len([v for v in snapshot_of(collector).all_ranks() if v.windows]) == 2, timeout_s=60)
    if not stepping:
        job.kill()
        pytest.fail(f"the job never reported from both ranks: {job.communicate(timeout=30)[0][-2000:]}")
    return job


def states(collector: Collector) -> dict[int, tuple[str, str]]:
    return {v.rank: (v.status, v.status_reason) for v in snapshot_of(collector).all_ranks()}


def test_a_job_stopped_with_sigterm_reads_ended_by_it_not_lost(collector: Collector) -> None:
    """What scancel, a container's stop and kill send: every rank says bye, naming the signal."""
    job = running_job(collector)
    job.send_signal(signal.SIGTERM)
    out, _ = job.communicate(timeout=60)
    ended = wait_for(lambda: all(s == DONE for s, _ in states(collector).values()), timeout_s=15)
    assert ended, f"{states(collector)}; the job printed:\n{out[-2000:]}"
    assert states(collector) == {0: (DONE, "ended by SIGTERM"), 1: (DONE, "ended by SIGTERM")}, out[-2000:]


def test_a_rank_killed_with_sigkill_is_lost_and_the_one_stopped_for_it_is_not(collector: Collector) -> None:
    """SIGKILL leaves no bye: that rank alone is lost; the launcher stops the other with SIGTERM, which says so."""
    job = running_job(collector)
    (victim,) = [v for v in snapshot_of(collector).all_ranks() if v.rank == 1]
    assert victim.hello.pid is not None
    os.kill(victim.hello.pid, signal.SIGKILL)
    out, _ = job.communicate(timeout=60)
    settled = wait_for(lambda: states(collector).get(1, ("", ""))[0] == LOST and states(collector)[0][0] == DONE,
                       timeout_s=15)  # fmt: skip
    assert settled, f"{states(collector)}; the job printed:\n{out[-2000:]}"
    assert states(collector)[0] == (DONE, "ended by SIGTERM")
