"""A rank's collectives over a span: each kind on each process group, a step's worth (pure).

The windows carry totals (``Window.collectives``, from the reporter's collective tap or DDP's
logger); a span adds them up kind by kind and group by group and divides by the steps of the
windows that carry them.  The communication finding, the rank detail screen, the report, the
exporter and ``gputop mcp`` read these.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from gputop.combine import merge_collectives
from gputop.protocol import Window


class CollectiveFigures(msgspec.Struct, frozen=True, gc=False):
    """One kind of collective on one process group, per step of the span (times None: not measured)."""

    kind: str  # "all_gather", "reduce_scatter", "all_reduce", …
    group: str  # the DeviceMesh dimension ("dp", "tp"), "world", or "pg N"
    calls: float  # a step
    bytes: float  # a step, what the rank sent in
    busy_s: float | None  # a step, issue to completion
    exposed_s: float | None  # a step, the training thread blocked on it

    @property
    def name(self) -> str:
        """``all_gather on dp``: how the findings and the screens name it."""
        return f"{self.kind} on {self.group}"


def collective_figures(windows: Sequence[Window]) -> tuple[CollectiveFigures, ...]:
    """The span's collectives a step, the one that held training up the longest first."""
    carrying = [w for w in windows if w.collectives]
    steps = sum(w.timed for w in carrying)
    if not steps:
        return ()
    return tuple(
        CollectiveFigures(
            c.kind,
            c.group,
            c.calls / steps,
            c.bytes / steps,
            None if c.busy_s is None else c.busy_s / steps,
            None if c.exposed_s is None else c.exposed_s / steps,
        )
        for c in merge_collectives(w.collectives for w in carrying)
    )
