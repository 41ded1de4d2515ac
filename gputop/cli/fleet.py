"""``gputop fleet URL``: the runs a cluster's Prometheus knows through gputop's job rules, printed once."""

from __future__ import annotations

import argparse
import dataclasses
import json

from gputop.cli.common import UserError
from gputop.fleet.query import FleetError, FleetRun, Prometheus, read_fleet


def cmd_fleet(args: argparse.Namespace) -> int:
    try:
        runs = read_fleet(Prometheus(args.url), args.job)
    except FleetError as exc:
        raise UserError(str(exc)) from None
    if args.format == "json":
        print(json.dumps({"prometheus": args.url, "runs": [dataclasses.asdict(r) for r in runs]}, indent=2))
    else:
        print("\n".join(line for run in runs for line in run_lines(run)))
    return 0


def run_lines(run: FleetRun) -> list[str]:
    """A run's line, its slowest ranks', and one line per alert at work."""
    figures = [f"{run.ranks} ranks"]
    if run.step_s is not None:
        figures.append(f"step {run.step_s * 1e3:.1f} ms")
    if run.steps_per_s is not None:
        figures.append(f"{run.steps_per_s:.1f} steps/s")
    if run.loader_wait is not None:
        figures.append(f"loader {run.loader_wait:.0%}")
    if run.exposed_comm is not None:
        figures.append(f"exposed comm {run.exposed_comm:.0%} (the rank that waits least)")
    if run.idle_gpu_hours_per_hour is not None:
        figures.append(f"{run.idle_gpu_hours_per_hour:.1f} idle GPU-hours an hour")
    lines = [f"run {run.run}: " + ", ".join(figures)]
    if run.slowest:
        worst = ", ".join(f"rank {s.rank} on {s.hostname or '?'} {s.score:+.0%}" for s in run.slowest)
        lines.append(f"  slowest ranks (the share of each step the others wait for them): {worst}")
    for alert in run.alerts:
        where = f" rank {alert.rank} on {alert.hostname}" if alert.rank else ""
        lines.append(f"  [{alert.state}] {alert.severity} {alert.cause}{where} ({alert.name})")
    return lines
