"""The only gputop code that runs on the training thread: step and loader timing.

Everything here touches memory only: a ``perf_counter()`` call, a float add, a
``deque.append`` (atomic under the GIL, so the reporter thread can ``popleft``
without a lock).  No I/O, no CUDA synchronisation, and every entry point is
wrapped so that a failure inside gputop is counted and never reaches training.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, Generic, NamedTuple, TypeVar

T = TypeVar("T")

# A reporter thread that stops draining (it never should) must not let the
# training process grow without bound: at 1 kHz steps this is ~65 s of steps.
MAX_PENDING_STEPS = 65536


class StepMark(NamedTuple):
    """One finished step, as the training thread saw it (a tuple: cheapest to build per step)."""

    end_s: float  # perf_counter at the step mark
    duration_s: float | None  # since the previous mark; None for the first step
    loader_wait_s: float  # blocked in the tracked loader during this step
    batches: int  # batches fetched from the tracked loader during this step
    cuda_event: Any = None  # a recorded torch.cuda.Event, harvested off-thread


class StepClock:
    """Collects step marks and loader waits from the training thread."""

    def __init__(self) -> None:
        self.marks: deque[StepMark] = deque(maxlen=MAX_PENDING_STEPS)
        self.errors = 0  # failures swallowed on the training thread
        self.event_factory: Any = None  # set by the reporter when the model is on CUDA
        self._loader_wait_s = 0.0
        self._batches = 0
        self._last_mark_s: float | None = None
        # Seconds the training thread spent inside gputop (step marks, loader bookkeeping),
        # cumulative: written here only, read by the reporter thread (a float read is atomic).
        self.hook_s = 0.0

    def add_loader_wait(self, seconds: float) -> None:
        self._loader_wait_s += seconds
        self._batches += 1

    def mark_step(self) -> None:
        """Close the current step.  Called from the optimizer post-hook or ``gputop.step()``."""
        now = time.perf_counter()
        event = None
        if self.event_factory is not None:
            try:
                event = self.event_factory()
                event.record()
            except Exception:
                self.errors += 1
                self.event_factory = None  # keep timing steps without GPU events
                event = None
        last, self._last_mark_s = self._last_mark_s, now
        self.marks.append(
            StepMark(now, None if last is None else now - last, self._loader_wait_s, self._batches, event)
        )
        self._loader_wait_s = 0.0
        self._batches = 0
        self.hook_s += time.perf_counter() - now

    def drain(self) -> list[StepMark]:
        """Take every mark so far (reporter thread)."""
        out = []
        marks = self.marks
        while True:
            try:
                out.append(marks.popleft())
            except IndexError:
                return out


class TrackedLoader(Generic[T]):
    """Wraps an iterable (usually a DataLoader) and times each wait for the next batch.

    Behaves like the wrapped loader: same batches, same ``len()``, attribute
    access passes through.  The wrapped loader's own exceptions propagate
    unchanged; gputop adds none.
    """

    def __init__(self, loader: Iterable[T], clock: StepClock) -> None:
        self._loader = loader
        self._clock = clock

    def __iter__(self) -> Iterator[T]:
        clock = self._clock
        perf = time.perf_counter
        start = perf()
        iterator = iter(self._loader)  # starting non-persistent workers is loader time too
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            got = perf()
            clock.add_loader_wait(got - start)
            clock.hook_s += perf() - got
            yield batch
            start = perf()

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
