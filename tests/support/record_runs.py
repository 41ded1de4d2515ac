"""Record the real runs that tests/unit/test_recorded_verdicts.py reads: each job run once, as `gputop record` sees it.

    .venv/bin/python -m tests.support.record_runs [NAME ...]    (every run when none is named)

Each run is a real 2-rank gloo job (the test jobs in ``jobs/`` launched as srun
would, or ``gputop demo``) beside a collector that samples the host, as `gputop
record` does, written to ``tests/data/runs/NAME.jsonl.gz``.  Record on a quiet
machine (nothing else running: `ps` first), then run the test file: a run whose
verdict the test does not read is either a rule that changed (the test says
which) or a run that went wrong (record it again and say why in the commit).
They are old recordings too, which today's gputop must still read: a change
that breaks them breaks users' recordings as well.  Record one again when its
job changes, or to see whether a verdict holds on a fresh run (the accuracy
benchmark asks that of every one, many times).
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gputop.address import Address
from gputop.collect import recording
from gputop.collect.live import LiveSource
from tests.support.processes import finish, gputop, launch

RUNS = Path(__file__).resolve().parent.parent / "data" / "runs"
BUSY_LOOP = "while True: pass"  # the program outside the job in ``allocation_outside_programs``


@dataclass(frozen=True)
class Run:
    name: str
    args: tuple[str, ...]  # a job in jobs/ and its arguments, or ("demo", SCENARIO, SECONDS)
    busy_loops: int = 0  # programs outside the job, each burning a core, for the whole run


RUN_LIST = (
    Run("allocation_workers_cpu_transform",
        ("ddp_job.py", "--steps", "150", "--workers", "3", "--transform-ms", "3", "--batch-size", "8")),
    Run("allocation_outside_programs",
        ("ddp_job.py", "--steps", "120", "--batch-size", "512", "--hidden", "2048", "--workers", "1"), busy_loops=2),
    Run("parallelism_small_gpt", ("tiny_gpt_job.py", "--steps", "400")),
    Run("model_config_find_unused", ("ddp_job.py", "--steps", "40", "--find-unused")),
    Run("straggler_metric_after_step",
        ("ddp_job.py", "--steps", "160", "--batch-size", "256", "--hidden", "1024", "--metric-ms", "30")),
    Run("straggler_rotating",
        ("ddp_job.py", "--steps", "160", "--batch-size", "256", "--hidden", "1024", "--metric-ms", "30",
         "--metric-rank", "-1")),
    Run("straggler_work_before_backward",
        ("ddp_job.py", "--steps", "120", "--batch-size", "256", "--hidden", "1024", "--pre-backward-ms", "80")),
    Run("straggler_slow_optimizer",
        ("ddp_job.py", "--steps", "160", "--batch-size", "256", "--hidden", "1024", "--optimizer-ms", "30")),
    Run("stall_checkpoint_every_10_rank0",
        ("ddp_job.py", "--steps", "150", "--batch-size", "512", "--hidden", "2048", "--stall-every", "10")),
    Run("compile_four_lengths", ("compile_job.py", "--shapes", "4", "--every", "4", "--steps", "48")),
    Run("compile_steady", ("compile_job.py", "--shapes", "1", "--steps", "60")),
    Run("fsdp2_straggler_extra_work_rank1", ("fsdp2_job.py", "--steps", "50", "--extra-ms", "80", "--extra-rank", "1")),
    Run("fsdp2_healthy",
        ("fsdp2_job.py", "--steps", "80", "--layers", "4", "--dim", "192", "--batch-size", "32", "--seq-len", "16")),
    Run("accelerate_loader_bound", ("accelerate_job.py", "--cpu", "--steps", "60", "--delay-ms", "80")),
    Run("healthy_symmetric_accumulation",
        ("ddp_job.py", "--steps", "60", "--batch-size", "64", "--hidden", "2048", "--accumulate", "4")),
    *(Run(f"demo_{scenario}", ("demo", scenario, "8"))
      for scenario in ("slow_loader", "straggler", "rotating", "comm_bound", "small_batch", "oversubscribed")),
    Run("demo_healthy_minute", ("demo", "healthy", "60")),
)  # fmt: skip


def path_of(name: str) -> Path:
    return RUNS / f"{name}.jsonl.gz"


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[None]:
    loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP], start_new_session=True) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def record(run: Run) -> Path:
    """Run it once beside a host-sampling collector that writes the recording; the recording's path."""
    out = path_of(run.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    if run.args[0] == "demo":  # the demo records itself, as a user's `gputop demo --record` does
        _, scenario, seconds = run.args
        demo = gputop("demo", "--headless", "--scenario", scenario, "--seconds", seconds, "--format", "json",
                      "--record", str(out), timeout_s=600)  # fmt: skip
        assert demo.returncode == 0, demo.stderr[-3000:]
        return out
    recorder = recording.Recorder(out, source="tests/support/record_runs.py")
    source = LiveSource(Address(port=0), sample_interval_s=1.0, recorder=recorder)
    source.start()
    try:
        with busy_loops(run.busy_loops):
            finish(launch(run.args[0], *run.args[1:], port=source.address.port), timeout_s=600)
            time.sleep(1.5)  # the ranks' last windows and byes, and a host sample after them
    finally:
        source.stop()
        recorder.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="runs to record (default: all)")
    names = parser.parse_args().names
    unknown = sorted(set(names) - {r.name for r in RUN_LIST})
    if unknown:
        parser.error(f"no run named {', '.join(unknown)}; runs: {', '.join(r.name for r in RUN_LIST)}")
    for run in RUN_LIST:
        if names and run.name not in names:
            continue
        started = time.monotonic()
        path = record(run)
        print(f"{run.name}: {path.stat().st_size / 1024:.0f} KiB in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
