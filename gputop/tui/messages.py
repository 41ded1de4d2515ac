"""The dashboard's messages: small dataclasses, all in one place."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from gputop.tui.view import DashboardView


@dataclass
class SnapshotReady(Message):
    """A new view, built off the UI thread from one ``source.snapshot()``.

    Only the newest matters: a view still queued when another arrives is replaced.
    """

    view: DashboardView
    finished: bool = False  # a replay reached the end of its recording

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SnapshotReady)


@dataclass
class SourceFailed(Message):
    """``source.snapshot()`` or the view built from it raised; the dashboard keeps the last view."""

    reason: str


@dataclass
class RowHighlighted(Message):
    """The ranks table's cursor came to a row: a rank's "run:rank" or a host's "host:run:name"."""

    key: str


@dataclass
class RowSelected(Message):
    """Enter or a click on the ranks table's cursor row."""

    key: str


@dataclass
class SortChanged(Message):
    """A click on a column's header sorted the ranks by it (the app retitles the panel)."""
