"""``gputop`` / ``gputop attach``: the dashboard over a live collector (and the start-up the replay shares)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gputop.cli.common import listen_address, start_prometheus

if TYPE_CHECKING:
    from gputop.collect.live import LiveSource


def run_dashboard(source: Any, args: argparse.Namespace, notice: str | None = None) -> int:
    """Show a started source until the user quits; the caller owns the source's start and stop.

    ``--refresh`` and ``--theme`` given here are remembered (gputop.tui.settings) for the next start.
    """
    from textual.theme import BUILTIN_THEMES

    from gputop.diagnose import Diagnoser
    from gputop.tui import settings
    from gputop.tui.app import run_dashboard as show

    saved = settings.load()
    theme = getattr(args, "theme", None)  # checked by the parser
    if saved.theme not in BUILTIN_THEMES:
        saved = dataclasses.replace(saved, theme=None)
    chosen = dataclasses.replace(saved, refresh_s=args.refresh or saved.refresh_s, theme=theme or saved.theme)
    if chosen != saved:
        settings.save(chosen)

    def remember_theme(name: str) -> None:
        if name != (chosen.theme or settings.DEFAULT_THEME):
            settings.save(dataclasses.replace(chosen, theme=name))

    # The UI shows rejected connections itself; log lines would corrupt the screen.
    logging.getLogger("gputop").addHandler(logging.NullHandler())
    logging.getLogger("gputop").propagate = False
    from gputop.diagnose.alerts import HOLD_S, AlertTracker

    alert_after_s = getattr(args, "alert_after", None)
    alerts = AlertTracker(hold_s=HOLD_S if alert_after_s is None else alert_after_s)
    return show(
        source,
        refresh_s=chosen.refresh_s or settings.DEFAULT_REFRESH_S,
        diagnoser_factory=Diagnoser,
        theme=chosen.theme or settings.DEFAULT_THEME,
        remember_theme=remember_theme,
        alerts=alerts,
        notice=notice,
        price_per_hour=getattr(args, "gpu_hour_price", None),
        # Off with --no-auto-capture, or `auto_capture = false` in the settings file.
        auto_capture=getattr(args, "auto_capture", True) and chosen.auto_capture is not False,
    )


@contextlib.contextmanager
def live_collector(args: argparse.Namespace) -> Iterator[LiveSource]:
    """``gputop attach``'s collector, started: listening where ``args`` say (the token rules checked), sampling,
    serving Prometheus if asked; stopped on the way out.  ``gputop mcp`` collects through this too."""
    from gputop.collect.live import LiveSource
    from gputop.yielding import yield_to_training

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
