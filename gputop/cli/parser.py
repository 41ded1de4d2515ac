"""The command line: ``gputop [attach] | mcp | record | capture | agent | report | replay | demo | doctor``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from gputop import __version__, settings
from gputop.cli.options import (
    add_address,
    add_alert_after,
    add_auto_capture,
    add_dashboard_options,
    add_live_collector,
    add_look,
    add_price,
    add_prometheus,
    add_sample_interval,
    capture_steps,
    positive,
    rank_list,
    theme_name,
)

if TYPE_CHECKING:
    Commands = argparse._SubParsersAction[argparse.ArgumentParser]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gputop",
        description="See why your GPUs sit idle: a live, rank-aware dashboard for PyTorch training.",
    )
    parser.add_argument("--version", action="version", version=f"gputop {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (_attach, _mcp, _record, _capture, _agent, _fleet, _report, _replay, _demo, _doctor):
        add(commands)
    return parser


def _attach(commands: Commands) -> None:
    attach = commands.add_parser("attach", help="open the dashboard (the default command)")
    add_live_collector(attach)
    add_dashboard_options(attach)


def _mcp(commands: Commands) -> None:
    mcp = commands.add_parser(
        "mcp",
        help="serve the live runs' findings to a coding agent over the Model Context Protocol (stdio)",
        description="Collect like `gputop attach` (the same --port/--socket/--listen and token rules) and answer "
        "an MCP client on stdin/stdout: the runs, their findings with evidence, cost and fix, a rank's figures, "
        "a recording's report, and a bounded profiler capture. Logs go to stderr. Needs the SDK: "
        "pip install 'gputop-train[mcp]'. See docs/mcp.md.",
    )
    add_live_collector(mcp)
    add_price(mcp)
    add_sample_interval(mcp)


def _record(commands: Commands) -> None:
    record = commands.add_parser("record", help="record reporters, GPU and host samples to a JSON-lines file")
    add_address(record)
    record.add_argument("--seconds", type=positive, required=True, help="stop after S seconds")
    record.add_argument(
        "-o", "--output", type=Path, required=True,
        help="the recording to write: run.jsonl, or run.jsonl.gz compressed (stays readable if killed)",
    )  # fmt: skip
    record.add_argument(
        "--merge-after", type=float, default=900.0, metavar="S",
        help="from S seconds on, merge each rank's windows into --merge-s ones (default 900; -1: never)",
    )  # fmt: skip
    record.add_argument("--merge-s", type=positive, default=10.0, metavar="S", help="merged window length (default 10)")
    record.add_argument("--interval", type=positive, default=1.0, metavar="S", help="GPU/host sampling period")
    record.add_argument(
        "--on-finding",
        metavar="CMD",
        help="run CMD (through the shell) with a warn/critical finding as JSON on stdin: once when it has held "
        "--alert-after seconds, again when it worsens or clears",
    )
    add_alert_after(record)
    add_auto_capture(record, when="; with --on-finding, which diagnoses")
    add_price(record)
    add_prometheus(record)


def _capture(commands: Commands) -> None:
    capture = commands.add_parser(
        "capture",
        help="profile ranks' next steps with torch.profiler, asked of the dashboard or recorder listening there",
    )
    add_address(capture)
    capture.add_argument("--rank", type=rank_list, required=True, help="the rank, or several: 0,1,3 (side by side)")
    capture.add_argument("--steps", type=capture_steps, default=5, help="steps to profile (default 5, at most 1000)")
    capture.add_argument("--run", default="", metavar="RUN_ID", help="the run (default: the newest with that rank)")
    capture.add_argument("--timeout", type=positive, default=120.0, metavar="S", help="wait at most S seconds")
    capture.add_argument("--format", choices=("text", "json"), default="text")


def _agent(commands: Commands) -> None:
    agent = commands.add_parser(
        "agent",
        help="send this host's GPU readings to a dashboard or recorder on another machine "
        "(local rank 0 starts one by itself; this is for a DaemonSet or a Slurm prolog); with --prometheus, "
        "be this node's exporter instead: its ranks report here, Prometheus scrapes them and its GPUs",
    )
    agent.add_argument(
        "--addr", metavar="HOST:PORT", default=None,
        help="the collector (default: GPUTOP_ADDR, GPUTOP_PORT or the local socket, as reporters resolve it)",
    )  # fmt: skip
    agent.add_argument("--interval", type=positive, default=1.0, metavar="S", help="seconds between samples")
    agent.add_argument(
        "--hostname", default=None,
        help="the host name this node's ranks report (default: this machine's; a DaemonSet pod passes its node's)",
    )  # fmt: skip
    add_prometheus(agent)
    add_address(agent)  # with --prometheus: where this node's ranks report (default: the per-user socket)


def _fleet(commands: Commands) -> None:
    fleet = commands.add_parser(
        "fleet",
        help="the runs a cluster's Prometheus knows through gputop's job rules: each run's slowest ranks and "
        "the alerts at work, live in a terminal (docs/prometheus.md)",
        description="In a terminal: a live view of the runs, refreshed at Prometheus's scrape interval, where "
        "enter on a slow rank opens its node's exporter, read every 2 s. Piped, or with --format: printed once.",
    )
    fleet.add_argument("url", metavar="URL", help="the Prometheus server, http://HOST:9090")
    fleet.add_argument("--job", metavar="RUN", help="only this run (its `run` label)")
    fleet.add_argument(
        "--format", choices=("text", "json"), default=None,
        help="print once in this format instead of the live view (the default when stdout is no terminal: text)",
    )  # fmt: skip
    fleet.add_argument(
        "--interval", type=positive, default=None, metavar="S",
        help="the live view reads Prometheus every S seconds (default: its scrape interval of gputop's "
        "exporters, else 15)",
    )  # fmt: skip
    fleet.add_argument(
        "--theme", dest=settings.THEME.key, type=theme_name, default=None,
        help="the live view's Textual theme (default: the dashboard's, from the config file)",
    )  # fmt: skip


def _report(commands: Commands) -> None:
    report = commands.add_parser(
        "report",
        help="summarise a recording: per rank, per GPU, findings; or compare two (--compare BEFORE AFTER)",
    )
    report.add_argument("recording", type=Path, nargs="?")
    report.add_argument(
        "--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"),
        help="set two recordings side by side: step time with its noise band, phases, ranks, findings gone or new",
    )  # fmt: skip
    report.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    add_price(report)


def _replay(commands: Commands) -> None:
    replay = commands.add_parser("replay", help="show a recording in the dashboard")
    replay.add_argument("recording", type=Path)
    replay.add_argument("--speed", type=positive, default=1.0, help="playback speed (default 1)")
    add_look(replay)


def _demo(commands: Commands) -> None:
    demo = commands.add_parser("demo", help="run a bundled 2-rank CPU DDP job and watch it")
    from gputop.demos.scenarios import SCENARIO_NAMES

    demo.add_argument("--scenario", choices=SCENARIO_NAMES, default="healthy")
    demo.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    demo.add_argument("--headless", action="store_true", help="no dashboard: print a report at the end")
    demo.add_argument("--seconds", type=positive, default=None, help="run for S seconds (headless default 15)")
    demo.add_argument("--format", choices=("text", "json", "markdown"), default="text", help="headless report format")
    demo.add_argument("--record", type=Path, default=None, help="also record the run to this file")
    add_dashboard_options(demo)


def _doctor(commands: Commands) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="say what gputop can see on this machine (NVML, GPUs, torch, sockets, settings) and why not",
        description="Check NVML and the driver, the GPUs, the container, torch, the per-user socket, the "
        "collector GPUTOP_PORT/GPUTOP_ADDR/GPUTOP_SOCKET name, the token and TLS settings, and every setting in "
        "force with where it came from: one line each, "
        "marked ok, -- (worth knowing) or !! (not ok: why, and what to do).",
        epilog="exit status: 0 when NVML answers with at least one GPU (a dashboard here would see GPUs), 1 otherwise",
    )
    doctor.add_argument("--format", choices=("text", "json"), default="text", help="json: for a bug report")
