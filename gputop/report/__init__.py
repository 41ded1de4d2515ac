"""``gputop report``: a recording (or a live store) summarised per run, rank and GPU.

``build`` (``gputop.report.entries``) turns the figures of a whole run
(``summarize(snapshot, span_s=None)``) into plain data (what ``--format json``
prints); ``to_text`` and ``to_markdown`` (``gputop.report.text``) render that
data; ``render`` does both for a snapshot.  The rank figures are the model's,
the same the dashboard shows and the findings quote.  No I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gputop.diagnose import diagnose
from gputop.diagnose.autocapture import captures_in, with_captures
from gputop.model.figures import summarize
from gputop.model.gpu_summary import summarize_gpus
from gputop.model.snapshot import Snapshot
from gputop.report.entries import (
    CostEntry,
    IdleEntry,
    build,
    cost_entry,
    idle_entry,
    rank_entry,
    undecided_notes,
)
from gputop.report.gpus import format_gpu_summary_text
from gputop.report.text import cost_text, idle_text, to_markdown, to_text

__all__ = [
    "CostEntry",
    "IdleEntry",
    "build",
    "cost_entry",
    "cost_text",
    "idle_entry",
    "idle_text",
    "of_snapshot",
    "rank_entry",
    "render",
    "to_json",
    "to_markdown",
    "to_text",
    "undecided_notes",
]


def of_snapshot(snapshot: Snapshot, notes: Sequence[str] = (), price_per_hour: float | None = None) -> dict[str, Any]:
    """The whole report of a snapshot's runs, over each rank's whole history, as plain data (``--format json``)."""
    figures = summarize(snapshot, span_s=None)
    # A profile the recorder had taken of a finding's culprit rank is in the recording: it goes on the finding.
    findings = with_captures(diagnose(figures), captures_in(figures))
    gpus = summarize_gpus(list(snapshot.gpu_samples()), snapshot)
    return build(figures, findings, gpus=gpus, notes=[*notes, *undecided_notes(figures)], price_per_hour=price_per_hour)


def render(snapshot: Snapshot, fmt: str, notes: Sequence[str] = (), price_per_hour: float | None = None) -> str:
    """The whole report of a snapshot's runs, over each rank's whole history, as text, markdown or json."""
    data = of_snapshot(snapshot, notes, price_per_hour)
    if fmt == "json":
        return to_json(data) + "\n"
    gpu_lines = format_gpu_summary_text(data["gpus"])
    if fmt == "markdown":
        return to_markdown(data, gpu_lines)
    return to_text(data, gpu_lines)


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2)
