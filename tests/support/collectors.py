"""A real collector under test: the token of a guarded one, what it holds, and waiting for what it receives."""

from __future__ import annotations

import time
from collections.abc import Callable

from gputop.collect.server import Collector
from gputop.model.snapshot import Snapshot

TOKEN = "correct horse battery staple"  # the shared token of the `guarded` collector (tests/conftest.py)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 30.0, interval_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def snapshot_of(collector: Collector) -> Snapshot:
    return collector.store.snapshot(time.time())


def window_count(collector: Collector) -> int:
    """Windows received so far, over every rank."""
    return sum(len(v.windows) for v in snapshot_of(collector).all_ranks())
