"""``gputop fleet URL``: the runs a cluster's Prometheus knows through gputop's job rules.

In a terminal, without ``--format``: the live view (``gputop.tui.fleet.app``).
Piped, or with ``--format``: printed once.  Either way Prometheus is read once
first, so an unreachable server, a missing rule or an unknown run is the same
one-line error and exit 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from gputop.cli.common import UserError
from gputop.fleet.query import FleetError, FleetRun, Prometheus, read_fleet, read_scraping


def cmd_fleet(args: argparse.Namespace) -> int:
    """Read Prometheus once; then the live view in a terminal, else print what was read."""
    try:
        prometheus = Prometheus(args.url)
        runs = read_fleet(prometheus, args.job)
    except FleetError as exc:
        raise UserError(str(exc)) from None
    if args.format is None and sys.stdout.isatty():
        return _live(prometheus, runs, args)
    if args.format == "json":
        print(json.dumps({"prometheus": args.url, "runs": [dataclasses.asdict(r) for r in runs]}, indent=2))
    else:
        print("\n".join(line for run in runs for line in run_lines(run)))
    return 0


def _live(prometheus: Prometheus, runs: list[FleetRun], args: argparse.Namespace) -> int:
    """The live view, from the runs just read; the theme is the dashboard's unless ``--theme`` says."""
    from textual.theme import BUILTIN_THEMES

    from gputop import settings
    from gputop.tui.fleet.app import run_fleet
    from gputop.tui.fleet.screen import FleetScreen

    theme = args.theme if args.theme in BUILTIN_THEMES else settings.THEME.default  # the file's may be unknown here
    scraping = read_scraping(prometheus)
    screen = FleetScreen(prometheus, run=args.job, interval_s=args.interval, runs=runs, scraping=scraping)
    return run_fleet(screen, theme=theme)


def run_lines(run: FleetRun) -> list[str]:
    """A run's line, its slowest ranks', and one line per alert at work."""
    no_longer_live = run.ended_text()  # "2 finished, 1 failed, 1 lost"
    figures = [f"{run.ranks} ranks" + (f" ({no_longer_live})" if no_longer_live else "")]
    if run.step_s is not None:
        figures.append(f"step {run.step_s * 1e3:.1f} ms")
    if run.steps_per_s is not None:
        figures.append(f"{run.steps_per_s:.1f} steps/s")
    if run.loader_wait is not None:
        figures.append(f"loader {run.loader_wait:.0%}")
    if run.exposed_comm is not None:
        figures.append(f"exposed comm {run.exposed_comm:.0%} (the rank that waits least)")
    if run.mfu is not None:
        figures.append(f"MFU {run.mfu:.1%} (the median rank)")
    if run.idle_gpu_hours_per_hour is not None:
        figures.append(f"{run.idle_gpu_hours_per_hour:.1f} idle GPU-hours an hour")
    lines = [f"run {run.run}: " + ", ".join(figures)]
    if run.slowest:
        worst = ", ".join(f"rank {s.rank} on {s.hostname or '?'} {s.score:+.0%}" for s in run.slowest)
        lines.append(f"  slowest ranks (the share of each step the others wait for them): {worst}")
    if run.waits:
        waits = ", ".join(f"{w.kind} on {w.group}: rank {w.rank} on {w.hostname or '?'}, "
                          f"the others {w.wait_s * 1e3:.1f} ms a step" for w in run.waits[:3])  # fmt: skip
        lines.append(f"  last to arrive (the rank the others wait for in each collective): {waits}")
    for alert in run.alerts:
        where = f" rank {alert.rank} on {alert.hostname}" if alert.rank else ""
        lines.append(f"  [{alert.state}] {alert.severity} {alert.cause}{where} ({alert.name})")
    return lines
