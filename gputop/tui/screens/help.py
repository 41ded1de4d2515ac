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
| `q` | quit |
| `?` | this help |
| `p` | pause: freeze the view (data keeps arriving) |
| `s` | sort the ranks by the next column |
| `enter` | the selected rank's detail: step phases, histories, facts |
| `esc` | back |
| `tab` | move focus |
| `ctrl+p` | command palette (themes, …) |

**Columns.** *step p50*: median wall time between optimizer steps over the last
10 s. *loader*: share of the step blocked in the tracked loader's `next()`.
*comm*: gradient exchange not hidden behind backward compute, as a share of the step.
*memory*: CUDA memory allocated / device total. *CPU%*: the rank process (100 = one core).

**▲** marks the rank the straggler finding names: its own time per step
(step time minus exposed comm) stands out while the others wait for it.

**N/A** means not measured, never zero; the rank's detail screen says why.
"""


class HelpScreen(ModalScreen[None]):
    """Keys and column meanings; any of esc, q or ? closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Back"),
        Binding("q", "dismiss", "Back", show=False),
        Binding("question_mark", "dismiss", "Back", show=False),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Markdown(HELP)
