"""Hangs and desyncs on real 2-rank gloo jobs, read from the ranks' numbered collectives (issue #48).

Each job steps for ~3 s first (50 steps of 50 ms): the tap counts from when a collector listens, and a rank
connects within a second.  Each job all-reduces a metric after every step (``--metric-all-reduce``): a collective
the tap sees, in which a waiting rank's reporter goes on speaking (gloo's wait releases the GIL; DDP's own
all-reduce holds it).  Each test waits, far from any threshold (the ranks stay stuck for 40 s or more; the hang
line is 5 s), for the finding's words, and says what the dashboard said when they do not come.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from mcp import Client
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from gputop.cli.mcp import report_of
from gputop.collect.server import Collector
from gputop.diagnose import Diagnoser, diagnose
from gputop.diagnose.details import DesyncDetails, HangDetails
from gputop.diagnose.findings import Finding
from gputop.export.prometheus import PrometheusExporter
from gputop.mcp.server import LiveFindings, build_server
from gputop.model.figures import SPAN_S, summarize
from gputop.model.snapshot import DONE
from gputop.model.source import FixedSource
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import JOBS, finish, launch, needs_torch

pytestmark = [pytest.mark.slow, needs_torch]

JOB = (JOBS / "ddp_job.py").read_text().splitlines()
METRIC_LINE = JOB.index("    dist.all_reduce(metric)  # the metric's all-reduce") + 1
METRIC_SITE = rf"`metric_all_reduce` \((?:tests/support/jobs/)?ddp_job\.py:{METRIC_LINE}\)"
BLOCKED_LINE = JOB.index(
    "            stuck.acquire(timeout=args.hang_s)  # blocked, no CPU; rank 0 waits in its next all-reduce"
)
BARRIER_LINE = JOB.index("    dist.barrier()  # no rank tears gloo down while another is still in a collective") + 1
BARRIER_SITE = rf"`main` \((?:tests/support/jobs/)?ddp_job\.py:{BARRIER_LINE}\)"
BLOCKED_SITE = rf"`main` \((?:tests/support/jobs/)?ddp_job\.py:{BLOCKED_LINE + 1}\)"


def findings(collector: Collector) -> list[Finding]:
    return diagnose(summarize(snapshot_of(collector), span_s=SPAN_S))


def said(collector: Collector) -> str:
    return " || ".join(f"{f.cause} ({f.severity}): {f.title}" for f in findings(collector)) or "no findings"


def wait_for_finding(collector: Collector, cause: str, matches: Callable[[Finding], bool], timeout_s: float) -> Finding:
    found: list[Finding] = []

    def seen() -> bool:
        found[:] = [f for f in findings(collector) if f.cause == cause and matches(f)]
        return bool(found)

    assert wait_for(seen, timeout_s=timeout_s, interval_s=0.5), f"no such {cause} finding; said: {said(collector)}"
    return found[0]


def end_hung(job: subprocess.Popen[str], collector: Collector) -> None:
    """A job gloo keeps hung for 30 minutes: its ranks killed (by the pids their hellos gave), the launcher reaped."""
    for view in snapshot_of(collector).all_ranks():
        with contextlib.suppress(OSError):
            os.kill(view.hello.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        job.communicate(timeout=60)
    if job.poll() is None:
        job.kill()
        job.communicate(timeout=30)


def test_a_rank_blocked_before_the_metrics_all_reduce_never_issued_the_one_rank_0_waits_in(
    collector: Collector,
) -> None:
    job = launch("ddp_job.py", "--steps", "80", "--delay-ms", "50", "--metric-all-reduce", "--hang-at", "50",
                 "--hang-s", "40", port=collector.address.port)  # fmt: skip
    try:
        hang = wait_for_finding(collector, "hang", lambda f: "never issued" in f.title, timeout_s=40)
        print(f"hang title: {hang.title}")
        waits = re.search(rf"rank 0 waits in all_reduce #(\d+) on world \(from {METRIC_SITE}\), which rank 1 never "
                          rf"issued \(its last: #(\d+)\)", hang.title)  # fmt: skip
        assert waits and int(waits[2]) == int(waits[1]) - 1, hang.title
        assert re.search(rf"rank 1 is in {BLOCKED_SITE}", hang.title), hang.title
        assert hang.ranks == (1,) and hang.waiting_ranks == (0,), hang
        assert isinstance(hang.details, HangDetails) and hang.details.collective is not None
        assert hang.details.collective.reading == "never_issued"
    finally:
        end_hung(job, collector)  # read, it need not sit out rank 1's 40 s (the stopped-peer test sees a job through)


def test_a_hung_job_ended_by_sigterm_is_reported_after_the_run_with_the_collective_and_how_it_ended(
    collector: Collector,
) -> None:
    """What a scheduler does to a hung job: SIGTERM once it has been stuck a while (here well past the 5-s line).
    The byes make every rank done; the run's story is still the hang: the all-reduce rank 0 waits in, the rank that
    never issued it, and the SIGTERM, read from the snapshot after every rank has ended."""
    job = launch("ddp_job.py", "--steps", "80", "--delay-ms", "50", "--metric-all-reduce", "--hang-at", "50",
                 "--hang-s", "600", port=collector.address.port)  # fmt: skip
    try:
        live = wait_for_finding(collector, "hang", lambda f: "never issued" in f.title, timeout_s=40)
        print(f"live: {live.title}")
        time.sleep(3.0)  # hung a while longer, as it would be when the scheduler gives up on it
        job.send_signal(signal.SIGTERM)  # the launcher passes it to both ranks
        with contextlib.suppress(subprocess.TimeoutExpired):
            job.communicate(timeout=30)
        ended = wait_for(lambda: {v.status for v in snapshot_of(collector).all_ranks()} == {DONE}, timeout_s=15)
        reasons = {v.rank: v.status_reason for v in snapshot_of(collector).all_ranks()}
        assert ended and set(reasons.values()) == {"ended by SIGTERM"}, reasons
        hangs = [f for f in findings(collector) if f.cause == "hang"]
        assert hangs, f"after the byes: {said(collector)}"
        (hang,) = hangs
        print(f"after the run: {hang.title}")
        assert hang.severity == "critical" and hang.ranks == (1,), hang
        assert re.search(rf"rank 0 waited in all_reduce #\d+ on world \(from {METRIC_SITE}\), which rank 1 never "
                         rf"issued", hang.title), hang.title  # fmt: skip
        assert hang.title.endswith("; then ended by SIGTERM"), hang.title
        # The exporter and the agent endpoint run the same rules on the same snapshot: they say it too.
        scraped = scrape_after_the_run(collector)
        shown = {(s.labels["cause"], s.labels["severity"], s.labels["rank"]) for s in scraped["gputop_finding"]}
        assert ("hang", "critical", "1") in shown, scraped["gputop_finding"]
        byes = sorted((s.labels["rank"], s.labels["how"]) for s in scraped["gputop_rank_ended"])
        assert byes == [("0", "signal"), ("1", "signal")], scraped["gputop_rank_ended"]
        (agent,) = [f for f in asyncio.run(agent_findings(collector)) if f["cause"] == "hang"]
        assert agent["title"] == hang.title and agent["severity"] == "critical", agent
    finally:
        end_hung(job, collector)


def scrape_after_the_run(collector: Collector) -> dict[str, list[Sample]]:
    """What Prometheus reads from an exporter over the collector, by metric (findings show once held 1 s: scraped
    until the hang shows, or for 15 s)."""
    exporter = PrometheusExporter(lambda: snapshot_of(collector), "127.0.0.1", 0, refresh_s=0.0)
    exporter.start()
    scraped: dict[str, list[Sample]] = {}
    try:

        def hang_shown() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=10) as answer:
                families = text_string_to_metric_families(answer.read().decode())
            scraped.update({family.name: family.samples for family in families})
            return any(s.labels["cause"] == "hang" for s in scraped.get("gputop_finding", ()))

        wait_for(hang_shown, timeout_s=15, interval_s=0.5)
    finally:
        exporter.stop()
    return scraped


async def agent_findings(collector: Collector) -> list[dict[str, Any]]:
    """`get_findings` from the MCP server over the collector's snapshot after the run, through the SDK's client."""
    live = LiveFindings(FixedSource(snapshot_of(collector)), refresh_s=0.05, diagnoser=Diagnoser(show_after_s=0.0))
    live.start()
    try:
        async with Client(build_server(live, lambda path: report_of(path, None))) as client:
            answer = (await client.call_tool("get_findings", {})).structured_content
    finally:
        live.stop()
    assert answer is not None
    return list(answer["findings"])


def test_a_tensor_parallel_rank_that_never_issued_the_collective_its_peer_waits_for_is_named_on_tp(
    collector: Collector,
) -> None:
    """A 2-D job (FSDP2 on dp, the MLPs tensor-parallel on tp): rank 1 blocks before its forward at step 12, and
    rank 0 waits in DTensor's wait_tensor for the all_reduce its RowwiseParallel issued, numbered on tp."""
    job = launch("fsdp2_job.py", "--tp", "--layers", "1", "--steps", "30", "--hang-at", "12", "--hang-s", "60",
                 port=collector.address.port)  # fmt: skip
    try:
        hang = wait_for_finding(collector, "hang", lambda f: "never issued" in f.title, timeout_s=60)
        print(f"hang title: {hang.title}")
        waits = re.search(r"rank 0 waits in all_reduce #(\d+) on tp .*which rank 1 never issued \(its last: #(\d+)\)",
                          hang.title)  # fmt: skip
        assert waits and int(waits[2]) < int(waits[1]), hang.title
        assert hang.ranks == (1,) and hang.waiting_ranks == (0,), hang
    finally:
        end_hung(job, collector)


def test_a_rank_waiting_in_ddps_own_all_reduce_keeps_reporting(collector: Collector) -> None:
    """Rank 1 blocks on a lock after step 50; rank 0 waits in DDP's gradient all-reduce, whose reducer lock DDP's
    logger takes.  Its reporter thread read that logger and went silent there; it goes on sending windows and
    stack samples, and the hang names rank 1, with rank 0 waiting for it."""
    job = launch("ddp_job.py", "--steps", "80", "--delay-ms", "50", "--hang-at", "50", "--hang-s", "40",
                 port=collector.address.port)  # fmt: skip
    try:
        hang = wait_for_finding(collector, "hang", lambda f: 1 in f.ranks, timeout_s=40)
        print(f"hang: {hang.title}")

        def rank_0() -> tuple[float, float, str]:
            """Its newest window's end, its newest stack sample's time, its status."""
            view = next(v for v in snapshot_of(collector).all_ranks() if v.rank == 0)
            newest = view.latest_stacks
            return (view.windows[-1].t1 if view.windows else 0.0), (newest.t if newest else 0.0), view.status

        before = rank_0()
        time.sleep(6.0)  # six windows and samples of a reporter that speaks (it went silent for good)
        after = rank_0()
        assert after[2] == "live" and after[0] >= before[0] + 2.0 and after[1] >= before[1] + 2.0, (before, after)
        assert hang.ranks == (1,) and hang.waiting_ranks == (0,), hang.title
        assert re.search(r"rank 0 waits in DDP's gradient all_reduce #(\d+) on world .*, which rank 1 never issued",
                         hang.title), hang.title  # fmt: skip
    finally:
        end_hung(job, collector)


def test_a_metric_summed_as_float32_on_one_rank_and_int32_on_the_other_is_a_desync_the_job_went_on_through(
    collector: Collector,
) -> None:
    """Rank 1 all-reduces its metric as an int32 at step 30, rank 0 as a float32: 4 bytes each, so gloo sums them
    and the job finishes with a wrong number.  Nothing was stuck, so the numbers sent in a hang said nothing; the
    digests each window carries name the collective and both calls, during the run and after it."""
    job = launch("ddp_job.py", "--steps", "60", "--delay-ms", "50", "--metric-all-reduce", "--int-at", "30",
                 port=collector.address.port)  # fmt: skip
    out = finish(job, timeout_s=120)
    assert job.returncode == 0, out[-2000:]
    ended = wait_for(lambda: {v.status for v in snapshot_of(collector).all_ranks()} == {DONE}, timeout_s=15)
    assert ended, said(collector)
    desyncs = [f for f in findings(collector) if f.cause == "desync"]
    assert desyncs, f"after the run: {said(collector)}"
    (desync,) = desyncs
    print(f"desync: {desync.title}")
    sides = rf"rank 0 all_reduce of 4 B float32 from {METRIC_SITE}; rank 1 all_reduce of 4 B int32 from {METRIC_SITE}"
    assert re.search(rf"collective #\d+ on world is not the same call on every rank: {sides}$", desync.title), (
        desync.title
    )
    assert desync.severity == "critical" and desync.ranks == (0, 1), desync


def test_a_metric_all_reduced_on_rank_0_only_meets_rank_1s_barrier_a_desync(collector: Collector) -> None:
    """After the last step rank 1 skips the metric's all-reduce (a branch on the rank) and goes on to the job's
    closing barrier: the two meet at one number on the default group, and gloo hangs on them.  (Skipped mid-run,
    rank 1's next collective is DDP's bucket, and gloo aborts at once on the sizes: nothing is stuck to report.)"""
    job = launch("ddp_job.py", "--steps", "50", "--delay-ms", "50", "--metric-all-reduce", "--skip-at", "50",
                 port=collector.address.port)  # fmt: skip
    try:
        desync = wait_for_finding(collector, "desync", lambda f: True, timeout_s=40)
        print(f"desync title: {desync.title}")
        # Read from the numbers sent while stuck, or first from the digests the windows carry, which say the dtype.
        sides = rf"rank 0 all_reduce of 4 B(?: float32)? from {METRIC_SITE}; rank 1 barrier from {BARRIER_SITE}$"
        assert re.search(r"collective #\d+ on world is not the same call on every rank: " + sides, desync.title), (
            desync.title
        )
        assert desync.ranks == (0, 1), desync
    finally:
        end_hung(job, collector)


def test_a_metric_of_another_size_on_one_rank_is_a_desync_with_both_call_sites(collector: Collector) -> None:
    job = launch("ddp_job.py", "--steps", "80", "--delay-ms", "50", "--metric-all-reduce", "--mismatch-at", "50",
                 port=collector.address.port)  # fmt: skip
    try:
        desync = wait_for_finding(collector, "desync", lambda f: True, timeout_s=40)
        print(f"desync title: {desync.title}")
        assert desync.severity == "critical" and desync.ranks == (0, 1), desync
        sides = re.search(rf"collective #(\d+) on world is not the same call on every rank: rank (\d) all_reduce of "
                          rf"(\d) B(?: float32)? from {METRIC_SITE}; rank (\d) all_reduce of (\d) B(?: float32)? from "
                          rf"{METRIC_SITE}$",
                          desync.title)  # fmt: skip
        assert sides and {(sides[2], sides[3]), (sides[4], sides[5])} == {("0", "4"), ("1", "8")}, desync.title
        assert isinstance(desync.details, DesyncDetails) and desync.details.number == int(sides[1])
        hang = wait_for_finding(collector, "hang", lambda f: "see desync" in f.title, timeout_s=20)
        assert hang.severity == "info", hang
    finally:
        end_hung(job, collector)


@pytest.mark.alone  # a verdict (or a time) read on a job run now: nothing beside it (__init__.py)
def test_a_peer_stopped_inside_the_exchange_leaves_every_rank_in_it_none_completed(collector: Collector) -> None:
    """Rank 0 blocks on a lock before the metric's all-reduce after step 50; rank 1 waits in it.  Once the finding
    says so, rank 1's process is stopped (SIGSTOP) inside the exchange; when rank 0's lock lets go it issues the
    all-reduce too, and neither completes: both issued it, the exchange itself is what is stuck."""
    job = launch("ddp_job.py", "--steps", "80", "--delay-ms", "50", "--metric-all-reduce", "--hang-at", "50",
                 "--hang-rank", "0", "--hang-s", "25", port=collector.address.port)  # fmt: skip
    stopped = 0
    try:
        first = wait_for_finding(collector, "hang", lambda f: "which rank 0 never issued" in f.title, timeout_s=40)
        print(f"before the stop: {first.title}")
        view = next(v for v in snapshot_of(collector).all_ranks() if v.rank == 1)
        stopped = view.hello.pid
        os.kill(stopped, signal.SIGSTOP)
        hang = wait_for_finding(collector, "hang", lambda f: "none completed" in f.title, timeout_s=40)
        print(f"after the stop: {hang.title}")
        assert re.search(r"ranks 0, 1 wait in all_reduce #\d+ on world .*every rank issued it and none completed "
                         r"it, so the exchange itself is stuck", hang.title), hang.title  # fmt: skip
        assert "the network" in hang.suggestion
    finally:
        if stopped:
            os.kill(stopped, signal.SIGCONT)
        finish(job, timeout_s=120)
