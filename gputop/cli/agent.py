"""``gputop agent``: this host's GPUs to a collector elsewhere, or (``--prometheus``) the node's exporter.

``gputop doctor``: what this machine lets gputop see.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from gputop.cli.common import UsageError, listen_address, log_to_stderr, sigterm_interrupts, start_prometheus


def cmd_agent(args: argparse.Namespace) -> int:
    """The node sampler, started by hand: this host's GPUs to a collector elsewhere (gputop.node); with
    ``--prometheus``, this node's exporter."""
    if args.prometheus:
        return export_node(args)
    if args.port is not None or args.socket or args.listen:
        raise UsageError(
            "--port, --socket and --listen say where this node's ranks report to an exporting agent: "
            "add --prometheus [ADDR]:PORT"
        )
    from gputop.node.sampler import main as agent_main

    argv = ["--interval", str(args.interval)]
    if args.addr:
        argv += ["--addr", args.addr]
    if args.hostname:
        argv += ["--hostname", args.hostname]
    return agent_main(argv)


def export_node(args: argparse.Namespace) -> int:
    """This node's exporter: the ranks here report to it, and Prometheus scrapes their figures, the findings
    gputop makes of them, and this host's GPUs; the cluster's rules compare nodes (docs/prometheus.md)."""
    from gputop.collect.live import LiveSource

    if args.addr:
        raise UsageError("--addr sends this host's GPUs to a collector elsewhere; with --prometheus the agent is "
                         "the collector: its ranks report to it (--port, --socket or --listen)")  # fmt: skip
    log_to_stderr()
    address = listen_address(args)
    source = LiveSource(address, sample_interval_s=args.interval)
    source.start()
    exporter = None
    try:
        exporter = start_prometheus(args, source)
        assert exporter is not None  # --prometheus was given
        if args.hostname:  # a DaemonSet pod: its GPUs are its node's
            exporter.gpu_hostname = args.hostname
        with contextlib.suppress(KeyboardInterrupt), sigterm_interrupts():
            print(f"gputop agent: the ranks here report to {address}; Prometheus metrics of them and this host's "
                  f"GPUs on :{exporter.port}/metrics", file=sys.stderr, flush=True)  # fmt: skip
            while True:
                time.sleep(3600)
    finally:
        if exporter is not None:
            exporter.stop()
        source.stop()
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """What gputop can see on this machine, and why not (gputop.doctor)."""
    from gputop.doctor import run

    return run(args.format)
