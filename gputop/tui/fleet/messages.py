"""``gputop fleet``'s messages: what a read off the UI thread brings back, small dataclasses in one place."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from gputop.fleet.node import NodePage
from gputop.fleet.query import FleetRun, Scraping


@dataclass
class FleetRead(Message):
    """``gputop fleet``: what Prometheus knows of the runs now, read off the UI thread."""

    runs: tuple[FleetRun, ...]
    scraping: Scraping | None  # how often Prometheus scrapes gputop, when asked this time
    read_t: float  # time.monotonic() of the read


@dataclass
class FleetFailed(Message):
    """``gputop fleet``: a refresh failed (FleetError's one line); the app keeps the last runs, marked stale."""

    reason: str
    scraping: Scraping | None


@dataclass
class NodeRead(Message):
    """``gputop fleet``'s node screen: its exporter's page, read off the UI thread."""

    page: NodePage
    read_t: float


@dataclass
class NodeFailed(Message):
    """``gputop fleet``'s node screen: its exporter could not be read (one line)."""

    reason: str
