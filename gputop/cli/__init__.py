"""The ``gputop`` command: attach (default), mcp, record, report, replay, capture, agent, demo, doctor.

A module per command; ``parser`` declares them all, ``options`` the options
several share, ``common`` the errors, the listening address, the recorder and
the exporter's start.  Errors a user can meet print one line (``gputop: ...``)
and exit 1; usage errors exit 2 (argparse).  Tracebacks are for bugs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from gputop import settings
from gputop.address import AddressError
from gputop.cli.agent import cmd_agent, cmd_doctor
from gputop.cli.capture import cmd_capture
from gputop.cli.common import EXIT_ERROR, EXIT_USAGE, UsageError, UserError
from gputop.cli.dashboard import cmd_attach
from gputop.cli.demo import cmd_demo
from gputop.cli.fleet import cmd_fleet
from gputop.cli.install_check import other_gputop
from gputop.cli.mcp import cmd_mcp
from gputop.cli.parser import build_parser
from gputop.cli.record import cmd_record
from gputop.cli.replay import cmd_replay
from gputop.cli.report import cmd_report

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a program the signal ended reports, as `yes | head` does

__all__ = ["UsageError", "UserError", "build_parser", "main", "parse_args"]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with each setting the command has a flag for in force (``gputop.settings``).

    Such a setting is its flag, else the config file's key, else its default; ``args.in_force`` keeps where
    each came from (the dashboard remembers what a flag set).  The address flags are resolved where they are
    used, by ``gputop.address``, with the environment's ``GPUTOP_PORT``, ``GPUTOP_ADDR`` and ``GPUTOP_SOCKET``.
    """
    args = build_parser().parse_args(argv)
    if args.command is None:  # `gputop` alone: attach with the defaults
        args = build_parser().parse_args(["attach", *(argv if argv is not None else sys.argv[1:])])
    taken = [setting for setting in settings.IN_FILE if hasattr(args, setting.key)]
    if taken:
        from gputop.settings import config_file

        args.in_force = settings.resolve(flags=vars(args), file=config_file.load())
        for setting in taken:
            setattr(args, setting.key, args.in_force.value(setting))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    if (collision := other_gputop()) is not None:  # the unrelated PyPI 'gputop' shares our files (docs/packaging.md)
        print(f"gputop: {collision}", file=sys.stderr)
    args = parse_args(argv)
    command = args.command
    handler = {"attach": cmd_attach, "mcp": cmd_mcp, "record": cmd_record, "report": cmd_report, "replay": cmd_replay,
               "capture": cmd_capture, "agent": cmd_agent, "doctor": cmd_doctor, "fleet": cmd_fleet,
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
