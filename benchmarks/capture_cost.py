"""What a profiler capture costs the captured steps, and that the steps around it pay nothing.

A real 2-rank gloo job (tests/support/jobs/ddp_job.py, no loader delay: compute and
all-reduce only) reports to an in-process collector.  For each of ROUNDS
rounds: the mean step time of both ranks over the 4 s before a capture, then a
capture of STEPS steps on both ranks at once (its ``wall_s / steps``), then the
4 s after.  Prints the three per-step times per round and the medians.

Run: .venv/bin/python benchmarks/capture_cost.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gputop.address import Address
from gputop.collect.server import Collector
from gputop.collect.store import Store
from gputop.protocol import CaptureRequest

ROUNDS, STEPS, SPAN_S = 5, 20, 4.0
JOB = Path(__file__).resolve().parent.parent / "tests" / "support" / "jobs" / "ddp_job.py"


def mean_step_s(collector: Collector, since_t: float, until_t: float) -> float:
    sums = steps = 0.0
    for view in collector.store.snapshot(time.time(), history=None).all_ranks():
        for w in view.windows:
            if since_t <= w.t0 and w.t1 <= until_t:
                sums += w.step_time_sum_s
                steps += w.timed
    return sums / steps if steps else float("nan")


def main() -> None:
    collector = Collector(Store(), Address(port=0))
    collector.start()
    traces = tempfile.mkdtemp(prefix="gputop-capture-bench-")
    env = {**os.environ, "GPUTOP_PORT": str(collector.address.port), "GPUTOP_TRACE_DIR": traces}
    job = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(JOB),
         "--steps", "100000000", "--batch-size", "64"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        while len([v for v in collector.store.snapshot(time.time()).all_ranks() if v.windows]) < 2:
            time.sleep(0.5)
        time.sleep(3.0)  # past DDP's first iterations
        rows = []
        for round_no in range(ROUNDS):
            t0 = time.time()
            time.sleep(SPAN_S)
            before = mean_step_s(collector, t0, time.time())
            requests = [CaptureRequest(rank=r, id=f"bench-{round_no}-{r}", steps=STEPS) for r in (0, 1)]
            with ThreadPoolExecutor(2) as pool:
                results = list(pool.map(lambda q: collector.request_capture(q).result(120), requests))
            during = statistics.mean(r.wall_s / r.steps for r in results if r.ok)
            t1 = time.time()
            time.sleep(SPAN_S)
            after = mean_step_s(collector, t1 + 0.5, time.time())
            rows.append((before, during, after))
            print(f"round {round_no}: before {before * 1e3:.2f} ms/step, captured {during * 1e3:.2f} ms/step, "
                  f"after {after * 1e3:.2f} ms/step")  # fmt: skip
        for name, index in (("before", 0), ("captured", 1), ("after", 2)):
            print(f"median {name}: {statistics.median(r[index] for r in rows) * 1e3:.2f} ms/step")
    finally:
        job.terminate()
        job.wait(30)
        collector.stop()


if __name__ == "__main__":
    main()
