"""The ``gputop`` command: attach (default), mcp, record, report, replay, capture, agent, demo, doctor.

A module per command; ``parser`` declares them all, ``options`` the options
several share, ``common`` the errors, the listening address, the recorder and
the exporter's start.  Errors a user can meet print one line (``gputop: ...``)
and exit 1; usage errors exit 2 (argparse).  Tracebacks are for bugs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from gputop.address import AddressError
from gputop.cli.agent import cmd_agent, cmd_doctor
from gputop.cli.capture import cmd_capture
from gputop.cli.common import EXIT_ERROR, EXIT_USAGE, UsageError, UserError
from gputop.cli.dashboard import cmd_attach
from gputop.cli.demo import cmd_demo
from gputop.cli.mcp import cmd_mcp
from gputop.cli.parser import build_parser
from gputop.cli.record import cmd_record
from gputop.cli.replay import cmd_replay
from gputop.cli.report import cmd_report
from gputop.install_check import other_gputop

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a program the signal ended reports, as `yes | head` does

__all__ = ["UsageError", "UserError", "build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    if (collision := other_gputop()) is not None:  # the unrelated PyPI 'gputop' shares our files (docs/packaging.md)
        print(f"gputop: {collision}", file=sys.stderr)
    args = build_parser().parse_args(argv)
    command = args.command or "attach"
    if args.command is None:  # `gputop` alone: attach with the defaults
        args = build_parser().parse_args(["attach", *(argv if argv is not None else sys.argv[1:])])
    if hasattr(args, "gpu_hour_price") and args.gpu_hour_price is None:  # not given: the config file's, if any
        from gputop.tui import settings

        args.gpu_hour_price = settings.load().gpu_hour_price
    handler = {"attach": cmd_attach, "mcp": cmd_mcp, "record": cmd_record, "report": cmd_report, "replay": cmd_replay,
               "capture": cmd_capture, "agent": cmd_agent, "doctor": cmd_doctor,
               "demo": cmd_demo}[command]  # fmt: skip
    try:
        return handler(args)
    except UsageError as exc:
        print(f"gputop: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (UserError, AddressError) as exc:
        print(f"gputop: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gputop doctor | head -1`: the reader had enough; no traceback for that
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's flush at exit would raise again
        return EXIT_BROKEN_PIPE
