"""A hang on a real 2-rank job, named live within 15 s, with the line it is blocked on, and cleared when it ends.

How the rules read other real jobs: tests/unit/test_recorded_verdicts.py, on recordings of them.
"""

from __future__ import annotations

import re

import pytest

from gputop.collect.server import Collector
from gputop.diagnose import diagnose
from gputop.diagnose.findings import Finding
from gputop.model.figures import summarize
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import JOBS, finish, launch, needs_torch

pytestmark = [pytest.mark.slow, pytest.mark.alone, needs_torch]


BLOCKED_LINE = "            stuck.acquire(timeout=args.hang_s)  # blocked, no CPU; rank 0 waits in its next all-reduce"


def test_a_rank_that_blocks_is_named_hung_within_15_s_and_cleared_when_steps_resume(collector: Collector) -> None:
    """Rank 1 waits on a lock for 25 s after step 30; rank 0 waits for it in the next all-reduce.

    The live findings (the dashboard's span) are read twice a second: the hang shows
    within 15 s of the last step, names rank 1 as hung and rank 0 as waiting, the
    step and the line rank 1 is blocked on, and is gone once the lock lets go and the ranks step again.
    """
    from gputop.model.figures import SPAN_S

    # torch's Flight Recorder on, as a user debugging hangs turns it on: gloo records too in torch 2.13.
    job = launch("ddp_job.py", "--steps", "60", "--hang-at", "30", "--hang-s", "25", port=collector.address.port,
                   env={"TORCH_FR_BUFFER_SIZE": "200"})  # fmt: skip
    try:
        hang: Finding | None = None
        last_step_t = seen_t = 0.0
        while job.poll() is None and hang is None:
            snapshot = snapshot_of(collector)
            stepped = [w.t1 for v in snapshot.all_ranks() for w in v.windows if w.steps > 0]
            last_step_t = max(stepped, default=0.0)
            hang = next((f for f in diagnose(summarize(snapshot, span_s=SPAN_S)) if f.cause == "hang"), None)
            seen_t = snapshot.t
            if hang is None:
                wait_for(lambda: False, timeout_s=0.5)
        assert hang is not None, "no hang finding while rank 1 was blocked"
        assert seen_t - last_step_t <= 15.0, f"the hang showed {seen_t - last_step_t:.1f} s after the last step"
        assert hang.severity == "critical" and "after step 30" in hang.title, hang.title
        # Its reporter samples the training thread's stack: the title names the line rank 1 is blocked on.
        blocked = (JOBS / "ddp_job.py").read_text().splitlines().index(BLOCKED_LINE) + 1
        place = rf"rank 1 is in `main` \((tests/support/jobs/)?ddp_job\.py:{blocked}\), after the optimizer step"
        assert re.search(place, hang.title), hang.title
        assert hang.to_dict()["frames"]["1"]["now"]["line"] == blocked
        # Where it is names the culprit: rank 1, on the lock; rank 0 waits for it, silent or in the all-reduce.
        assert hang.ranks == (1,) and hang.waiting_ranks == (0,), hang

        # 3 s after a rank's last step the title names who never joined: from the ranks' collective numbers (rank
        # 0's reporter goes on speaking while it waits in DDP's all-reduce, issue #55), or from torch's Flight
        # Recorder (read then too) where only one rank could say.
        def title() -> str:
            found = [f for f in diagnose(summarize(snapshot_of(collector), span_s=SPAN_S)) if f.cause == "hang"]
            return found[0].title if found else ""

        assert wait_for(lambda: "never issued" in title() or "Flight Recorder" in title(), timeout_s=10), hang.title
        said = title()
        numbers = re.search(r"rank 0 waits in DDP's gradient all_reduce #(\d+) on world .*, which rank 1 never issued "
                            r"\(its last: #(\d+)\)", said)  # fmt: skip
        both = re.search(r"Flight Recorder: rank 0 entered gloo:\w+ #(\d+), rank 1's last was gloo:\w+ #(\d+)", said)
        alone = re.search(r"Flight Recorder: rank 1's last collective was gloo:\w+ #\d+", said)
        assert (numbers and int(numbers[1]) > int(numbers[2])) or (both and int(both[1]) > int(both[2])) or alone, said
        assert wait_for(
            lambda: not any(f.cause == "hang" for f in diagnose(summarize(snapshot_of(collector), span_s=SPAN_S))),
            timeout_s=40,
        ), "the hang finding outlived the hang"
    finally:
        finish(job, timeout_s=120)
