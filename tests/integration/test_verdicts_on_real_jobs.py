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
from gputop.model.snapshot import DONE
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import JOBS, finish, launch, needs_torch

pytestmark = [pytest.mark.slow, pytest.mark.alone, needs_torch]


def run_and_diagnose(collector: Collector, *args: str, job: str = "ddp_job.py") -> tuple[list[Finding], str]:
    """Run ``job`` with ``args``; the whole run's findings (as `gputop report` sees them) and a summary.

    A share is only called against its line with a band, which needs 3 windows or more: a job here runs for
    5 s or more, several of the default 1-s windows (80 steps of ~37 ms, 3 s, left a straggler "too few
    windows yet to call").
    """
    finish(launch(job, *args, port=collector.address.port), timeout_s=240)
    assert wait_for(lambda: all(v.status == DONE for v in snapshot_of(collector).all_ranks()), timeout_s=30)
    figures = summarize(snapshot_of(collector), span_s=None)
    findings = diagnose(figures)
    measured = "; ".join(
        f"rank {r.rank}: step {1e3 * (r.stats.step_time_mean_s or 0):.0f} ms, "
        f"cpu wait {100 * (r.stats.cpu_starved_frac or 0):.0f}% wanting {r.stats.cpu_demand_cores or 0:.2f} CPUs, "
        f"workers' cpu wait {100 * (r.stats.workers_cpu_starved_frac or 0):.0f}%, "
        f"loader {100 * (r.stats.loader_wait_frac or 0):.0f}%, "
        f"exposed comm {100 * (r.stats.exposed_comm_frac or 0):.0f}%, "
        f"p50 {1e3 * (r.stats.step_time_p50_s or 0):.1f} ms, stalls {r.stats.stall_steps} "
        f"of {1e3 * (r.stats.stall_mean_s or 0):.0f} ms ({100 * (r.stats.stall_frac or 0):.0f}%, "
        f"in comm {100 * (r.stats.stall_in_comm_frac or 0):.0f}%)"
        for r in figures.all_ranks()
    )
    said = " | ".join(f"[{f.severity}] {f.cause}: {f.title}" for f in findings)
    return findings, f"measured {measured}; found {said}"


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
        assert hang.extra["frames"][1]["now"]["line"] == blocked
        # Where it is names the culprit: rank 1, on the lock; rank 0 waits for it, silent or in the all-reduce.
        assert hang.ranks == (1,) and hang.extra["waiting_ranks"] == [0], hang

        # The recorder is read 3 s after a rank's last step: the title then names who never joined.
        def flight_recorder_text() -> str:
            found = [f for f in diagnose(summarize(snapshot_of(collector), span_s=SPAN_S)) if f.cause == "hang"]
            return found[0].title if found else ""

        assert wait_for(lambda: "Flight Recorder" in flight_recorder_text(), timeout_s=10), hang.title
        said = flight_recorder_text()
        # Rank 1, blocked on the lock, names its last collective. Rank 0 waits in DDP's all-reduce, which on
        # gloo holds the GIL: its reporter often falls silent ("stopped reporting"); when it can say, it
        # entered a later collective than rank 1's last.
        both = re.search(r"Flight Recorder: rank 0 entered gloo:\w+ #(\d+), rank 1's last was gloo:\w+ #(\d+)", said)
        alone = re.search(r"Flight Recorder: rank 1's last collective was gloo:\w+ #\d+", said)
        assert (both and int(both[1]) > int(both[2])) or alone, said
        assert wait_for(
            lambda: not any(f.cause == "hang" for f in diagnose(summarize(snapshot_of(collector), span_s=SPAN_S))),
            timeout_s=40,
        ), "the hang finding outlived the hang"
    finally:
        finish(job, timeout_s=120)
