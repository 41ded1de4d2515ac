"""``gputop mcp``: the collector ``gputop attach`` starts, answering a coding agent over MCP on stdio."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

from gputop.cli.common import UserError, log_to_stderr, sigterm_interrupts
from gputop.cli.dashboard import live_collector
from gputop.cli.report import load

INSTALL_HINT = "gputop mcp needs the MCP SDK: pip install 'gputop-train[mcp]'"


def cmd_mcp(args: argparse.Namespace) -> int:
    try:
        from gputop.mcp.server import serve
    except ModuleNotFoundError as exc:  # the SDK is an optional extra
        if (exc.name or "").partition(".")[0] in ("mcp", "pydantic", "anyio"):
            raise UserError(INSTALL_HINT) from None
        raise
    log_to_stderr()  # stdout is the protocol's
    # The SDK logs through the root logger to stderr as well: each of gputop's lines once is enough.
    logging.getLogger("gputop").propagate = False
    with contextlib.ExitStack() as stack:
        # Until the SDK takes stdout over (it points fd 1 at stderr while it serves), a stray print from the
        # collector's start would be a line of garbage in the protocol: it goes to the log instead.
        with contextlib.redirect_stdout(sys.stderr):
            source = stack.enter_context(live_collector(args))
        stack.enter_context(contextlib.suppress(KeyboardInterrupt))
        stack.enter_context(sigterm_interrupts())
        print(f"gputop: answering MCP on stdio; ranks report to {source.address}", file=sys.stderr)
        serve(source, lambda path: report_of(path, args.gpu_hour_price), price_per_hour=args.gpu_hour_price)
    # Ended by a signal, the SDK's stdin reader (a worker thread, not a daemon) is still blocked reading a
    # pipe the client holds open, and the interpreter would wait for it at exit: the collector is stopped
    # and its socket gone, so leave now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def report_of(path: Path, price_per_hour: float | None) -> dict[str, Any]:
    """``gputop report PATH --format json``'s data; the one line ``gputop report`` would print as the error."""
    from gputop import report
    from gputop.mcp.answers import BadArgument

    try:
        store, last_t, notes = load(path)
    except UserError as exc:
        raise BadArgument(str(exc)) from None
    return report.of_snapshot(store.snapshot(last_t, history=None), notes, price_per_hour)
