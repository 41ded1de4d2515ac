"""What the dashboard and ``gputop fleet`` share as apps: the stylesheet, the keys to leave and for help, the theme,
and leaving as a terminal would have them leave.

Each is this shell and screens of its own: the dashboard (``gputop.tui.app``) a
main screen under rank details, the fleet (``gputop.tui.fleet.app``) its runs
under a node's page.  ``run_in_terminal`` runs either until the user quits.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from textual.app import App
from textual.binding import Binding, BindingType
from textual.message import Message

from gputop.tui.screens.help import HelpScreen
from gputop.tui.terminal import exit_when_the_terminal_goes


@dataclass
class TerminalGone(Message):
    """The terminal hung up without a SIGHUP (gputop.tui.terminal): leave as a hangup would."""


class Shell(App[int]):
    """An app with gputop's look and its ``q``, ``ctrl+c`` and ``?``; its subclass adds keys and the screen."""

    # Absolute: Textual would look for a relative path beside the subclass's module.
    CSS_PATH = Path(__file__).parent / "gputop.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        # Beside a training job in a terminal, Ctrl-C means "stop", as in nvitop and top.
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        Binding("question_mark", "help", "Help", key_display="?"),
    ]

    leave_on_sigterm = False
    """SIGTERM closes the app as ``q`` would, restoring the terminal (``run_in_terminal`` sets it).

    Python's default is to die on the spot: the screen stayed drawn, the terminal kept
    reporting the mouse, and ``gputop demo`` skipped stopping its job in order.
    Off under the test pilot, whose process is pytest's.
    """

    def __init__(self, *, help_text: str, theme: str | None = None) -> None:
        """Build the app.

        Args:
            help_text: What ``?`` shows: the keys and what the screen's words mean (Markdown).
            theme: A Textual theme name; None keeps Textual's default.
        """
        super().__init__()
        if theme is not None:
            self.theme = theme
        self.help_text = help_text

    def on_mount(self) -> None:
        # Textual calls this after the subclass's own on_mount: handlers up the class tree all run.
        if self.leave_on_sigterm:  # through the event loop: a plain signal handler could cut into its queues
            leave = functools.partial(self.exit, return_code=128 + signal.SIGTERM)  # as a SIGTERM death would say
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, leave)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.help_text))

    def request_exit(self) -> None:
        """Exit soon, from any thread (the terminal watch's)."""
        self.post_message(TerminalGone())

    def on_terminal_gone(self, message: TerminalGone) -> None:
        self.exit(return_code=129)  # 128 + SIGHUP: what a hangup would have made of gputop


def run_in_terminal(app: Shell) -> int:
    """Run ``app`` until the user quits, leaving on SIGTERM or a terminal gone as on ``q``; returns the exit code."""
    app.leave_on_sigterm = True
    exit_when_the_terminal_goes(sys.__stdout__.fileno() if sys.__stdout__ else 1, app.request_exit)
    result = app.run()
    return result if isinstance(result, int) else (app.return_code or 0)
