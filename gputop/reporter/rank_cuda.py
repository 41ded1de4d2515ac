"""The rank's CUDA device: where the reporter's ``torch.cuda`` comes from, and every call with that device current.

A CUDA call on a thread that never chose a device runs on device 0 and makes
a context there if the process has none: ~500 MiB of GPU 0 per rank, enough
to run rank 0 out of memory (torchcomms PR #777; vLLM PR #37449, ~800 MiB per
worker).  The reporter thread is such a thread, and so is a training thread
that placed its model with ``model.to(rank)`` and never called
``torch.cuda.set_device`` (PyTorch's DDP tutorial does this): its current
device is still 0, so an event recorded on "the current stream" times GPU 0's
idle stream, and GPU step time reads as wall time.  torch's ``Event.query()``
calls ``cudaEventQuery`` with no device guard, and ``elapsed_time()`` queries
first (``c10/cuda/CUDAEvent.h``); dropping an event destroys it, which
switches devices too (pytorch PR #135273).

So ``RankCuda`` holds the index of the device the model's parameters are on
and runs every call inside ``torch.cuda.device(index)``, on whichever thread
calls it: step events are made and recorded on that device's current stream
(training thread), queried, timed and dropped there (reporter thread), and
the allocator's counters are read for it.  The phase timeline
(``cuda_timeline``) records on the same device through ``cuda`` and the same
scope, and its events go with these at ``release``.  Leaving the scope hands
the thread back the device torch had for it, switching back only to a device
that already has a context (c10's ``MaybeExchangeDevice``, thread-local), so
the training thread's ``torch.cuda.current_device()`` is what the script left it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from gputop.reporter.capture_mode import THREAD_LOCAL, exchanger

T = TypeVar("T")

# A GPU that stops completing events (a hung kernel) must not make us hold events
# without bound: past this many the training thread stops recording new ones.
MAX_PENDING_EVENTS = 10_000


class RankCuda:
    """One CUDA device of this rank: step events and memory counters, each call scoped to the device.

    ``cuda`` is ``torch.cuda`` or a stand-in with its names (the tests pass
    one that records which device each call happens on).
    """

    def __init__(self, index: int, cuda: Any = None) -> None:
        if cuda is None:
            import torch

            cuda = torch.cuda
        self.index = index
        self._cuda = cuda
        # Appended by the training thread, taken by the reporter thread (deque ends are atomic under the GIL).
        self._recorded: deque[Any] = deque()
        self._last: Any = None  # the newest completed event: where the next GPU step starts
        # What else holds events on this device (the phase timeline): dropped with these, in scope, at release.
        self._releases: list[Callable[[], None]] = []
        # A CUDA graph being captured on the stream takes no step mark: the event would be a node of the graph.
        self._capturing: Callable[[], bool] = getattr(cuda, "is_current_stream_capturing", bool)
        # The reporter thread reads in thread-local capture mode, so a query never breaks another thread's capture.
        self._exchange = exchanger(cuda)

    @property
    def cuda(self) -> Any:
        """``torch.cuda`` or the stand-in: for code that records on this device, always through ``scoped``."""
        return self._cuda

    def on_release(self, drop: Callable[[], None]) -> None:
        """Call ``drop`` at ``release``, with the device current: it lets go of the events it holds."""
        self._releases.append(drop)

    def scoped(self, work: Callable[[], T]) -> T:
        """``work()`` with the rank's device current on this thread (see ``_scoped``)."""
        return self._scoped(work)

    def reading(self, work: Callable[[], T]) -> T:
        """``work()`` that queries, times or drops events (the reporter thread): in scope, and in thread-local capture
        interaction mode, so that none of its calls invalidates a CUDA graph another thread is capturing
        (``capture_mode.py``)."""
        exchange = self._exchange
        if exchange is None:
            return self._scoped(work)

        def guarded() -> T:
            previous = exchange(THREAD_LOCAL)
            try:
                return work()
            finally:
                exchange(previous)

        return self._scoped(guarded)

    def _scoped(self, work: Callable[[], T]) -> T:
        """``work()`` with the rank's device current on this thread.

        A failure leaves as a plain RuntimeError raised after the scope: the
        original's traceback holds ``work``'s frames, and with them the events
        it was handling, and those must be released in here.
        """
        with self._cuda.device(self.index):
            try:
                return work()
            except Exception as exc:
                failure = f"{type(exc).__name__}: {exc}"
        raise RuntimeError(failure)

    # -- training thread ------------------------------------------------------------

    def record_step(self) -> None:
        """Mark the end of a step on the current stream of the rank's device.  Never synchronises.

        Never evicts an old event to make room: dropping an event destroys it,
        which only ``step_times_s`` does, in scope.
        """
        if len(self._recorded) < MAX_PENDING_EVENTS:
            event = self._scoped(self._new_event)
            if event is not None:
                self._recorded.append(event)

    def _new_event(self) -> Any:
        """A step event on the device's current stream; None inside a CUDA graph capture there, where an event
        would be a node of the graph that the reporter could never read (and every later step behind it)."""
        cuda = self._cuda
        if self._capturing():
            return None
        event = cuda.Event(enable_timing=True)
        event.record(cuda.current_stream(self.index))  # not record(): that takes the current device's stream
        return event

    # -- reporter thread ------------------------------------------------------------

    def step_times_s(self) -> list[float]:
        """GPU time between consecutive completed step events, oldest first.

        ``query()`` never waits: an event the GPU has not reached yet stays for
        the next call, so the training thread is never synchronised.
        """
        return self.reading(self._harvest)

    def _harvest(self) -> list[float]:
        # Events are dropped only here (the previous ``_last``) and in ``_drop_events``,
        # both run by ``_scoped``; this frame's locals end before the scope does.
        times: list[float] = []
        recorded = self._recorded
        while recorded and recorded[0].query():
            event = recorded.popleft()
            if self._last is not None:
                times.append(self._last.elapsed_time(event) / 1000.0)
            self._last = event
        return times

    def memory_stats(self) -> dict[str, Any]:
        """The caching allocator's counters for the device (host-side, no synchronisation); {} before CUDA starts."""
        cuda = self._cuda
        if not cuda.is_initialized():
            return {}
        return self._scoped(lambda: dict(cuda.memory_stats(self.index)))

    def release(self) -> None:
        """Drop every event, with the device current (at exit, on the reporter thread)."""
        self.reading(self._drop_events)

    def _drop_events(self) -> None:
        self._recorded.clear()
        self._last = None
        for drop in self._releases:
            drop()


def model_cuda_index(model: Any, *, cuda_in_use: bool) -> tuple[int | None, str | None]:
    """The CUDA device every parameter of ``model`` is on; else None and why GPU step time cannot be measured.

    The reason is None for a CPU run (CUDA never started in this process):
    there is nothing to explain.  Raises what ``model.parameters()`` raises.
    """
    devices = {p.device for p in model.parameters()}
    names = " and ".join(sorted(str(d) for d in devices))
    if len(devices) > 1:
        return None, f"the model's parameters are on {names}; GPU step time needs them on one GPU"
    if devices:
        (device,) = devices
        if device.type == "cuda" and device.index is not None:
            return device.index, None
    if not cuda_in_use:
        return None, None
    if not devices:
        return None, "the watched model has no parameters, so its GPU is unknown"
    return None, f"the model's parameters are on {names} while this process uses CUDA; watch it once it is on its GPU"
