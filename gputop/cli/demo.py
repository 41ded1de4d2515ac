"""``gputop demo``: a bundled 2-rank CPU DDP job, watched in the dashboard or reported headless."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import socket
import sys
import tempfile
import time
from pathlib import Path

from gputop.address import Address
from gputop.cli.common import UserError, log_to_stderr, open_recorder
from gputop.cli.dashboard import run_dashboard
from gputop.demos.job import DemoJob


def cmd_demo(args: argparse.Namespace) -> int:
    from gputop import report
    from gputop.collect.live import LiveSource
    from gputop.demos.scenarios import plan, usable_cores

    if importlib.util.find_spec("torch") is None:
        raise UserError("`gputop demo` runs a real PyTorch job and needs torch: pip install 'gputop-train[torch]'")
    if args.nproc < 1:
        raise UserError("--nproc must be at least 1")
    seconds = args.seconds if args.seconds is not None else (15.0 if args.headless else None)
    planned = plan(args.scenario, cores=usable_cores(), nproc=args.nproc)
    recorder = open_recorder(args.record, source="demo") if args.record is not None else None
    source = LiveSource(Address(port=0), sample_interval_s=args.interval, recorder=recorder)
    job: DemoJob | None = None
    keep_log = False
    try:
        source.start()
        port = source.address.port
        assert port is not None
        log_file = tempfile.NamedTemporaryFile(prefix="gputop-demo-", suffix=".log", delete=False)  # noqa: SIM115
        log_file.close()
        job = DemoJob(
            scenario=args.scenario, nproc=args.nproc, port=port, seconds=seconds, log_path=Path(log_file.name)
        )
        if not args.headless:
            ui_code = run_dashboard(source, args, notice=planned)
            keep_log = job.proc.poll() not in (None, 0)  # the job failed while watched
            if keep_log:
                print(f"gputop: the demo job exited with code {job.proc.returncode}; its log: {job.log_path}")
            return ui_code
        log_to_stderr()
        assert seconds is not None  # headless runs always have a length
        print(f"gputop: {planned}, {seconds:g} s", file=sys.stderr)
        # torch's import and the process group's start take a few seconds before the timed part.
        code = job.wait(seconds + 90.0)
        keep_log = True
        if code is None:
            raise UserError(f"the demo job did not finish in {seconds + 90:.0f} s; its log: {job.log_path}")
        time.sleep(0.3)  # the ranks' last windows are sent at exit; let the collector take them in
        snapshot = source.store.snapshot(time.time(), history=None)
        if code != 0 or not snapshot.runs:
            why = f"exited with code {code}" if code != 0 else "ran but nothing reported"
            raise UserError(f"the demo job {why}; last lines of {job.log_path}:\n{job.log_tail()}")
        keep_log = False
        sys.stdout.write(report.render(snapshot, args.format))
        return 0
    finally:
        if job is not None:
            # Ranks reported their pids: stop those too, in case torchrun died before it could.
            job.stop(rank_pids=source.store.rank_pids(include_finished=True, hostname=socket.gethostname()))
            if not keep_log:
                with contextlib.suppress(OSError):
                    job.log_path.unlink()
        source.stop()
        if recorder is not None:
            recorder.close()
