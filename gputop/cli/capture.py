"""``gputop capture``: ask the collector listening there to have ranks profile their next steps."""

from __future__ import annotations

import argparse
import os
import sys
import time

from gputop.address import resolve
from gputop.cli.common import EXIT_ERROR, UserError


def cmd_capture(args: argparse.Namespace) -> int:
    """Ask the collector at the address to have each rank profile its next steps; print them side by side."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    import msgspec

    from gputop.collect.capture_relay import ask
    from gputop.model.captures import render
    from gputop.protocol import CaptureRequest, ProtocolError

    address = resolve(args.port, args.socket)
    tag = f"{int(time.time())}-{os.getpid()}"
    requests = [
        CaptureRequest(run_id=args.run, rank=rank, id=f"cli-{tag}-r{rank}", steps=args.steps, timeout_s=args.timeout)
        for rank in args.rank
    ]
    print(f"gputop: capturing {args.steps} steps on rank(s) {', '.join(map(str, args.rank))} via {address}",
          file=sys.stderr)  # fmt: skip
    try:
        # All at once: the ranks profile the same steps, which is what makes them comparable.
        with ThreadPoolExecutor(max_workers=len(requests)) as pool:
            results = list(pool.map(lambda request: ask(address, request), requests))
    except (ConnectionRefusedError, FileNotFoundError):
        raise UserError(f"nothing listens on {address}: start `gputop` or `gputop record` there first") from None
    except (OSError, ProtocolError) as exc:
        raise UserError(f"capture via {address} failed: {exc}") from None
    if args.format == "json":
        print(json.dumps([msgspec.to_builtins(r) for r in results], indent=2))
    else:
        print("\n".join(render(results)))
    return 0 if all(r.ok for r in results) else EXIT_ERROR
