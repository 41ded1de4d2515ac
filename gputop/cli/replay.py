"""``gputop replay``: a recording in the dashboard, at its recorded pace or faster."""

from __future__ import annotations

import argparse

from gputop.cli.common import UserError
from gputop.cli.dashboard import run_dashboard


def cmd_replay(args: argparse.Namespace) -> int:
    from gputop.collect.recording import RecordingError
    from gputop.collect.replay import ReplaySource

    try:
        source = ReplaySource(args.recording, speed=args.speed)
    except RecordingError as exc:
        raise UserError(str(exc)) from None
    source.start()
    try:
        return run_dashboard(source, args)
    finally:
        source.stop()
