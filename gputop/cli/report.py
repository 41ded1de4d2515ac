"""``gputop report``: a recording summarised per rank, per GPU, with its findings."""

from __future__ import annotations

import argparse
import sys

from gputop.cli.common import UserError


def cmd_report(args: argparse.Namespace) -> int:
    from gputop import recording, report

    stats = recording.ReadStats()
    try:
        store, last_t = recording.load(args.recording, stats)
    except recording.RecordingError as exc:
        raise UserError(str(exc)) from None
    notes = []
    if stats.skipped:
        notes.append(
            f"skipped {stats.skipped} damaged line(s) of {stats.lines} (first at {stats.first_skipped}); "
            "a recorder killed mid-write leaves one"
        )
    sys.stdout.write(report.render(store.snapshot(last_t, history=None), args.format, notes))
    return 0
