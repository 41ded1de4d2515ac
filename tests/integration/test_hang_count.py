"""A hang on a real 2-rank job names the collective by number without torch's Flight Recorder (issue #48).

The default process group's own count, read by each rank while it has not stepped: rank 1, blocked on a lock,
never issued the all-reduce rank 0 waits in.
"""

from __future__ import annotations

import re

import pytest

from gputop.collect.server import Collector
from gputop.diagnose import diagnose
from gputop.model.figures import SPAN_S, summarize
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import finish, launch, needs_torch

pytestmark = [pytest.mark.slow, needs_torch]

BOTH = re.compile(r"rank 0 entered collective #(\d+) on default_pg, rank 1's last was collective #(\d+) on default_pg")
ALONE = re.compile(r"rank 1's last was collective #\d+ on default_pg")
# Rank 0's reporter speaks while it waits in DDP's all-reduce (issue #55): both counts read as one collective.
READ = re.compile(
    r"rank 0 waits in DDP's gradient all_reduce #(\d+) on world .*, which rank 1 never issued \(its last: #(\d+)\)"
)


def test_a_hang_numbers_the_collective_the_blocked_rank_never_issued(collector: Collector) -> None:
    job = launch("ddp_job.py", "--steps", "40", "--hang-at", "10", "--hang-s", "20", port=collector.address.port)
    try:

        def hang_title() -> str:
            findings = diagnose(summarize(snapshot_of(collector), span_s=SPAN_S))
            return next((f.title for f in findings if f.cause == "hang"), "")

        named = wait_for(lambda: "collective #" in hang_title() or "never issued" in hang_title(), timeout_s=40)
        said = hang_title()
        assert named, f"no hang title naming a collective while rank 1 was blocked: {said!r}"
        print(f"hang title: {said}")
        assert "Flight Recorder" not in said, said
        both, read = BOTH.search(said), READ.search(said)
        # Where only rank 1 could say, only its count is said.
        assert any(m and int(m[1]) > int(m[2]) for m in (both, read)) or ALONE.search(said), said
    finally:
        finish(job, timeout_s=120)
