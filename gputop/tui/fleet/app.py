"""``gputop fleet URL`` in a terminal: the fleet's screen (``screen``) on the dashboard's shell, and its help."""

from __future__ import annotations

from typing import ClassVar

from textual.binding import Binding, BindingType

from gputop.tui.fleet.screen import FleetScreen
from gputop.tui.shell import Shell, run_in_terminal

FLEET_HELP = """\
# gputop fleet

| key | does |
|---|---|
| `q`, `ctrl+c` | quit |
| `?` | this help |
| `↑` `↓` | move through the runs (the ranks, the alerts): the run under the cursor shows its ranks and alerts |
| `enter` | on a run: go to its slowest ranks; on a slow rank, or an alert that names a rank: its node, live |
| `tab` | move between the runs, the slowest ranks and the alerts |
| `r` | read Prometheus now (or the node's exporter, on the node screen) |
| `esc` | back from the node screen |

**Runs** are Prometheus's, through gputop's job rules (docs/prometheus.md): *ranks*
its exporters export, with those no longer live beside them: *finished* (a normal exit, or a signal such as a
cancellation's SIGTERM), *failed* (an exception; in the warning colour) and *lost* (silent, or gone without a
bye; in red), *step p50* the median of the ranks' mean step, *loader* the
ranks' mean share of the step waiting for data, *comm* the exposed communication of
the rank that waits least, *idle GPU-h/h* the GPU-hours the run's GPUs sit idle every
hour, *worst alert* the first of its gputop alerts (firing before pending, critical first).
They are read once a scrape interval: Prometheus has nothing newer in between.

**Slowest ranks**: the three whose own time a step (step less exposed communication)
stands out most from the run's median; *others wait* is that excess as a share of a
step, the time every other rank waits for it.

**Node screen**: every rank, GPU and finding the node's exporter (`instance`) has now,
read from its own `/metrics` every 2 s.

**N/A** means Prometheus (or the exporter) has no value: never zero. The run's
N/As are explained under its tables.
"""


class FleetApp(Shell):
    """The fleet over one Prometheus server."""

    TITLE = "gputop fleet"
    BINDINGS: ClassVar[list[BindingType]] = [  # after the shell's q, ctrl+c and ?
        # The app's, not the screen's: the footer keeps its place after ?, and the node screen binds its own r.
        Binding("r", "refresh_now", "Refresh"),
    ]

    def __init__(self, screen: FleetScreen, *, theme: str | None = None) -> None:
        """The app around ``screen`` (what it reads, and how often, is the screen's); ``theme``: a Textual theme
        name, None keeps Textual's default."""
        super().__init__(help_text=FLEET_HELP, theme=theme)
        self.main = screen

    def get_default_screen(self) -> FleetScreen:
        return self.main

    def action_refresh_now(self) -> None:
        self.main.read()


def run_fleet(screen: FleetScreen, *, theme: str | None = None) -> int:
    """Show the fleet until the user quits; returns the exit code."""
    return run_in_terminal(FleetApp(screen, theme=theme))
