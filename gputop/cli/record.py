"""``gputop record``: reporters, GPU and host samples to a file, headless; alerts with ``--on-finding``."""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import sys
import time
from typing import TYPE_CHECKING

from gputop.cli.common import listen_address, log_to_stderr, open_recorder, sigterm_interrupts, start_prometheus

if TYPE_CHECKING:
    from gputop.collect.live import LiveSource
    from gputop.protocol import CaptureRequest, CaptureResult

ALERT_CHECK_S = 1.0  # how often `record --on-finding` diagnoses: the dashboard refreshes twice as often


def cmd_record(args: argparse.Namespace) -> int:
    from gputop.collect.live import LiveSource

    log_to_stderr()
    address = listen_address(args)
    merge_after_s = args.merge_after if args.merge_after >= 0 else None
    recorder = open_recorder(args.output, source=str(address), merge_after_s=merge_after_s, merge_s=args.merge_s)
    source = LiveSource(address, sample_interval_s=args.interval, recorder=recorder)
    exporter = None
    try:
        source.start()
        exporter = start_prometheus(args, source)
        metrics = f", Prometheus metrics on :{exporter.port}/metrics" if exporter is not None else ""
        with contextlib.suppress(KeyboardInterrupt), sigterm_interrupts():
            # Said once SIGTERM stops it cleanly: a script may wait for this line, then signal.
            print(f"gputop: recording {address} to {args.output} for {args.seconds:g} s{metrics}", file=sys.stderr)
            if args.on_finding:
                record_with_alerts(source, args.seconds, args.on_finding, args.alert_after, args.gpu_hour_price,
                                   auto_capture=args.auto_capture)  # fmt: skip
            else:
                time.sleep(args.seconds)
    finally:
        if exporter is not None:
            exporter.stop()
        source.stop()
        recorder.close()
    snapshot = source.snapshot()
    ranks = snapshot.all_ranks()
    hosts = len({r.hello.hostname for r in ranks})
    print(
        f"gputop: wrote {recorder.lines} lines from {len(ranks)} rank(s) on {hosts} host(s) to {args.output}",
        file=sys.stderr,
    )
    if snapshot.node_gpu_history:  # nodes' samplers sent their GPUs: say whose, so a missing node shows
        names = list(snapshot.node_gpu_history)
        nodes = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        print(f"gputop: GPUs of {len(snapshot.node_gpu_history)} other host(s): {nodes}", file=sys.stderr)
    if snapshot.token_refusals:
        print(f"gputop: refused {snapshot.token_refusals} connection(s) for a wrong or missing token", file=sys.stderr)
    return 0


def record_with_alerts(
    source: LiveSource,
    seconds: float,
    command: str,
    hold_s: float,
    price_per_hour: float | None = None,
    *,
    auto_capture: bool = True,
) -> None:
    """Diagnose once a second while recording and run ``command`` for each alert.

    ``auto_capture``: profile a straggler's or stall's culprit rank once the finding has held (the rank's
    result is recorded like any message; ``gputop report`` puts it on the finding).
    """
    from gputop.cli.alert_command import AlertCommand
    from gputop.diagnose import Diagnoser
    from gputop.diagnose.alerts import AlertTracker
    from gputop.diagnose.autocapture import AutoCapture
    from gputop.diagnose.pipeline import RefreshPipeline

    pipeline = RefreshPipeline(
        diagnoser=Diagnoser(),
        alerts=AlertTracker(hold_s=hold_s),
        auto_capture=AutoCapture() if auto_capture else None,
    )
    runner = AlertCommand(command, price_per_hour=price_per_hour)
    asked: list[tuple[CaptureRequest, concurrent.futures.Future[CaptureResult]]] = []
    end_s = time.monotonic() + seconds
    said = "ok"
    try:
        while (left_s := end_s - time.monotonic()) > 0:
            time.sleep(min(ALERT_CHECK_S, left_s))
            update = pipeline.update(source.snapshot())
            if update.diagnosis != said:  # a rule that raised: said once, not every second
                said = update.diagnosis
                print(f"gputop: diagnosis {said}", file=sys.stderr)
            for run_id, briefs in update.to_ranks.items():
                source.notify_findings(run_id, briefs)  # the ranks log them beside their loss
            for alert in update.alerts:
                capture = alert.finding.capture
                said_what = capture.text() if alert.kind == "captured" and capture is not None else alert.finding.title
                print(f"gputop: {alert.kind}: {said_what}", file=sys.stderr)
                runner.run(alert)
            for request in update.captures:  # answered in a later snapshot; the future only says why not
                print(f"gputop: profiling rank {request.rank} of {request.run_id} ({request.id})", file=sys.stderr)
                asked.append((request, source.request_capture(request)))
            asked = [(request, future) for request, future in asked if not _finished(request, future)]
            runner.reap()
    finally:
        runner.wait()


def _finished(request: CaptureRequest, future: concurrent.futures.Future[CaptureResult]) -> bool:
    """Whether the request was answered (never waits); a capture that did not happen is said on stderr."""
    if not future.done():
        return False
    try:
        result = future.result()
    except Exception as exc:  # the relay broke: the recording goes on
        print(f"gputop: no profile of rank {request.rank} ({request.id}): {type(exc).__name__}: {exc}", file=sys.stderr)
        return True
    if not result.ok:
        print(f"gputop: no profile of rank {request.rank} ({request.id}): {result.error}", file=sys.stderr)
    return True
