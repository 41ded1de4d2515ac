"""The keys, and what the columns mean."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# gputop

| key | does |
|---|---|
| `q`, `ctrl+c` | quit |
| `?` | this help |
| `p` | pause: freeze the view (data keeps arriving); again to go live |
| `[` | pause and step back one moment: the whole screen shows it |
| `]` | step forward; past the newest moment, live again |
| `s`, click a column's header | sort the ranks by the next column, or by that column |
| `f` | fold every host under its summary row, or open them all |
| `enter`, click | on a rank: its detail (step phases, histories, facts); on a host: fold or open it |
| `↑` `↓` `pgup` `pgdn` `home` `end` | move through the ranks |
| `esc` | back |
| `tab` | move focus |
| `ctrl+p` | command palette (themes, …); the theme and `--refresh` are remembered in `~/.config/gputop/config.toml` |

**Columns.** *step phases* (*step* on narrow screens): where each step goes, as
a stacked bar: ■ loader wait, ■ forward, ■ backward, ■ exposed comm, ■ other
(colours as in the legend on the table's title and the detail screen); dots
when a phase is not measured. *step p50*: median wall time between optimizer steps over the last
10 s. *loader*: share of the step blocked in the tracked loader's `next()`.
*comm*: gradient exchange not hidden behind backward compute, as a share of the step.
*memory*: CUDA memory allocated / device total. *CPU%*: the rank process (100 = one core).

**Hosts.** Ranks on several hosts are grouped under one row per host (×N ranks,
median step, summed samples/s, mean shares); past 16 ranks the hosts start folded.

**Charts.** *run*: the run's mean step time and samples/s per second, and each
GPU's utilization and memory, newest at the right.

**Underlined**: the columns (in the finding's colour) and the ranks' cells the top
finding's evidence reads, so the numbers behind it are easy to find.

**▲** marks the rank the straggler finding names: its own time per step
(step time minus exposed comm) stands out while the others wait for it.

**N/A** means not measured, never zero; the rank's detail screen says why.
"""


class HelpScreen(ModalScreen[None]):
    """Keys and column meanings (the dashboard's, or ``text``: another app's); any of esc, q or ? closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Back"),
        Binding("q", "dismiss", "Back", show=False),
        Binding("question_mark", "dismiss", "Back", show=False),
    ]

    def __init__(self, text: str = HELP) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Markdown(self.text)
