"""``gputop`` / ``gputop attach``: the dashboard over a live collector (and the start-up the replay shares)."""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gputop import settings
from gputop.cli.common import listen_address, start_prometheus

if TYPE_CHECKING:
    from gputop.collect.live import LiveSource
    from gputop.model.source import SnapshotSource

REMEMBERED = (settings.REFRESH_S.key, settings.THEME.key)  # what a flag here sets for the next start too


def run_dashboard(source: SnapshotSource, args: argparse.Namespace, notice: str | None = None) -> int:
    """Show a started source until the user quits; the caller owns the source's start and stop.

    ``--refresh`` and ``--theme`` given here are remembered in the config file (gputop.settings.config_file)
    for the next start, and so is a theme picked in the app.
    """
    from textual.theme import BUILTIN_THEMES

    from gputop.diagnose import Diagnoser
    from gputop.settings import config_file
    from gputop.tui.app import run_dashboard as show

    in_force: settings.InForce = args.in_force  # gputop.cli.parse_args
    given = [reading for reading in in_force if reading.setting.key in REMEMBERED and reading.source == "flag"]
    if given:
        config_file.remember({reading.setting.key: reading.value for reading in given})
    theme = in_force.value(settings.THEME)
    if theme not in BUILTIN_THEMES:  # the file's, from another Textual perhaps: the flag's are checked
        theme = settings.THEME.default

    def remember_theme(name: str) -> None:
        if name != theme:
            config_file.remember({settings.THEME.key: name})

    # The UI shows rejected connections itself; log lines would corrupt the screen.
    logging.getLogger("gputop").addHandler(logging.NullHandler())
    logging.getLogger("gputop").propagate = False
    from gputop.diagnose.alerts import HOLD_S, AlertTracker

    alert_after_s = getattr(args, "alert_after", None)
    alerts = AlertTracker(hold_s=HOLD_S if alert_after_s is None else alert_after_s)
    return show(
        source,
        refresh_s=in_force.value(settings.REFRESH_S),
        diagnoser_factory=Diagnoser,
        theme=theme,
        remember_theme=remember_theme,
        alerts=alerts,
        notice=notice,
        price_per_hour=in_force.value(settings.GPU_HOUR_PRICE),
        auto_capture=in_force.value(settings.AUTO_CAPTURE),  # --no-auto-capture, or `auto_capture = false`
    )


@contextlib.contextmanager
def live_collector(args: argparse.Namespace) -> Iterator[LiveSource]:
    """``gputop attach``'s collector, started: listening where ``args`` say (the token rules checked), sampling,
    serving Prometheus if asked; stopped on the way out.  ``gputop mcp`` collects through this too."""
    from gputop.collect.live import LiveSource
    from gputop.processes.yielding import yield_to_training

    # Before any thread starts, so every one inherits it; not in `gputop demo`, whose ranks are
    # its children and would inherit it too.
    yield_to_training()
    source = LiveSource(listen_address(args), sample_interval_s=args.interval)
    source.start()
    exporter = None
    try:
        exporter = start_prometheus(args, source)
        yield source
    finally:
        if exporter is not None:
            exporter.stop()
        source.stop()


def cmd_attach(args: argparse.Namespace) -> int:
    with live_collector(args) as source:
        return run_dashboard(source, args)
