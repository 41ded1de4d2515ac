"""One probe per source a window reads besides the step marks: DDP, CUDA memory, GPU events, the process.

Each probe runs on the reporter thread only, once per window: ``read(marks)``
returns the ``Window`` fields it measured (an empty dict for "nothing this
time") and may raise; the reporter catches that, turns the probe's columns to
N/A and reports the error once as an event.  A probe that cannot measure, with
nothing wrong (a model on two GPUs, DDP logging zeros), says why in
``not_measured``: the reporter sends each reason once as a ``not_measured``
event.  A probe holds whatever state it needs between windows, so each can be
tested on its own.
"""

from __future__ import annotations

from typing import Any, Protocol

from gputop.reporter.clock import StepMark


class Probe(Protocol):
    """A source of window fields."""

    name: str  # names the probe in the error event: "ddp_stats", "memory", ...
    not_measured: str | None  # why its fields are N/A now, with nothing wrong; None when they are measured

    def read(self, marks: list[StepMark]) -> dict[str, Any]: ...
