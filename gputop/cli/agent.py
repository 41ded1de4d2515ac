"""``gputop agent``: this host's GPUs to a collector elsewhere; ``gputop doctor``: what this machine lets gputop see."""

from __future__ import annotations

import argparse


def cmd_agent(args: argparse.Namespace) -> int:
    """The node sampler, started by hand: this host's GPUs to a collector elsewhere (gputop.node)."""
    from gputop.node.sampler import main as agent_main

    argv = ["--interval", str(args.interval)]
    if args.addr:
        argv += ["--addr", args.addr]
    if args.hostname:
        argv += ["--hostname", args.hostname]
    return agent_main(argv)


def cmd_doctor(args: argparse.Namespace) -> int:
    """What gputop can see on this machine, and why not (gputop.doctor)."""
    from gputop.doctor import run

    return run(args.format)
