"""A real thread blocked in a real place, and what the stack sampler reads of it from another thread."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from gputop.protocol import Stacks
from gputop.reporter.clock import StepClock
from gputop.reporter.stacks import StackSampler


@contextlib.contextmanager
def blocked(target: Callable[[threading.Event], Any]) -> Iterator[threading.Thread]:
    """A thread running ``target(release)`` until the block ends; it is sampled meanwhile."""
    release = threading.Event()
    thread = threading.Thread(target=target, args=(release,), daemon=True)
    thread.start()
    time.sleep(0.2)  # into the blocking call
    try:
        yield thread
    finally:
        release.set()
        thread.join(10)


def sampled(thread: threading.Thread, *, samples: int = 5, clock: StepClock | None = None,
            forwards: tuple[Any, ...] = ()) -> Stacks:  # fmt: skip
    sampler = StackSampler(thread.ident or 0, clock=clock)
    sampler.watch_forwards(forwards)
    for _ in range(samples):
        sampler.sample()
    return sampler.take("run", 0, time.time())
