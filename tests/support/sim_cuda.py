"""A simulated GPU with its own clock, for the reporter's CUDA code without a GPU: ``SimCuda`` is ``torch.cuda``.

Streams hold work in the order it was queued: kernels of a given length (or one that never ends), event
records, and waits for an event.  Each runs when the previous one on its stream has finished and not before
it was queued; a wait finishes when the event it waits for has.  The test moves the device clock
(``advance``): an event has completed when the time its stream reached it is past the clock, and
``elapsed_time`` is the difference of those times.  Nothing here blocks: there is no ``synchronize`` to call.

Like the CUDA runtime, every thread starts on device 0 and ``device(i)`` changes the calling thread's current
device for the block; every call is recorded with the thread and the device current at the time, so a test
can check that none happened on another device (which would make a context on GPU 0, torchcomms PR #777).

Graph capture is simulated as the CUDA runtime has it (``capture``): while a thread captures in global mode, a
"potentially unsafe" call (an event's query, its elapsed time) from any thread whose
capture interaction mode is global invalidates that capture and fails; a thread that set its mode to thread-local
(``exchange_capture_mode``, cudaThreadExchangeStreamCaptureMode) may make them.  An event recorded on the
capturing stream becomes a node of the graph: it never completes, and asking it is an error.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Call:
    """One call into the simulated ``torch.cuda``."""

    what: str  # "Event", "current_stream", "record", "query", "elapsed_time", "wait", "destroy", ...
    thread: str  # the calling thread's name
    current: int  # the device current on the calling thread when it called
    device: int | None  # the device the call is about: the stream's, the event's


class Op:
    """One item of work on a stream."""

    def __init__(
        self, stream: SimStream, queued_ms: float, length_ms: float = 0.0, waits_for: Op | None = None
    ) -> None:
        self.stream = stream
        self.queued_ms = queued_ms
        self.length_ms = length_ms  # math.inf: a kernel that never ends (until ``finish``)
        self.waits_for = waits_for
        self.captured = False  # recorded on a capturing stream: a node of the graph, never run here


class SimStream:
    """A CUDA stream of the simulated device: work runs in the order it was queued."""

    def __init__(self, sim: SimCuda, device: int, name: str) -> None:
        self.sim = sim
        self.device = device
        self.name = name
        self.ops: list[Op] = []

    def __repr__(self) -> str:
        return f"<SimStream {self.name} on {self.device}>"

    def wait_event(self, event: SimEvent) -> None:
        """``torch.cuda.Stream.wait_event``: later work here waits for the event's latest record."""
        event.wait(self)


class SimEvent:
    """``torch.cuda.Event``: made on the device of the stream it is first recorded on."""

    def __init__(self, sim: SimCuda) -> None:
        self.sim = sim
        self.device: int | None = None
        self.op: Op | None = None  # its latest record

    def record(self, stream: SimStream | None = None) -> None:
        stream = stream if stream is not None else self.sim.current_stream()
        if self.device is not None and self.device != stream.device:
            raise RuntimeError("Event device does not match recording stream's device")
        self.device = stream.device
        self.sim.log("record", stream.device)
        self.op = self.sim.enqueue(stream, Op(stream, self.sim.now_ms))
        self.op.captured = self.sim.capturing(stream)

    def wait(self, stream: SimStream | None = None) -> None:
        stream = stream if stream is not None else self.sim.current_stream()
        self.sim.log("wait", stream.device)
        if self.op is not None:
            self.sim.enqueue(stream, Op(stream, self.sim.now_ms, waits_for=self.op))

    def query(self) -> bool:
        self.sim.log("query", self.device)
        self.sim.unsafe("query")
        if self.op is not None and self.op.captured:
            raise RuntimeError("CUDA error: operation not permitted on an event last recorded in a capturing stream")
        return self.op is None or self.sim.done_at(self.op) <= self.sim.now_ms

    def elapsed_time(self, end: SimEvent) -> float:
        self.sim.log("elapsed_time", self.device)
        self.sim.unsafe("elapsed_time")
        if self.op is None or end.op is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if not (self.sim.done_at(self.op) <= self.sim.now_ms and self.sim.done_at(end.op) <= self.sim.now_ms):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return self.sim.done_at(end.op) - self.sim.done_at(self.op)

    def __del__(self) -> None:
        if self.device is not None:  # torch destroys only events that were made (recorded once)
            self.sim.log("destroy", self.device)


class Devices(Protocol):
    """A stand-in ``torch.cuda``'s device of the calling thread."""

    def current_device(self) -> int: ...

    def set_device(self, index: int) -> None: ...


class DeviceScope:
    """``torch.cuda.device(i)``: device i current on this thread inside, the previous one after (any stand-in)."""

    def __init__(self, cuda: Devices, index: int) -> None:
        self.cuda, self.index, self.previous = cuda, index, 0

    def __enter__(self) -> None:
        self.previous = self.cuda.current_device()
        self.cuda.set_device(self.index)

    def __exit__(self, *exc: object) -> None:
        self.cuda.set_device(self.previous)


class SimCuda:
    """The names the reporter uses of ``torch.cuda``, on ``devices`` simulated GPUs sharing one clock (ms)."""

    def __init__(self, devices: int = 4) -> None:
        self.now_ms = 0.0
        self.calls: list[Call] = []  # list.append is atomic: several threads log here
        self._threads = threading.local()
        self.default = [SimStream(self, i, f"default:{i}") for i in range(devices)]
        self._version = 0  # bumped on every change of the work queued: the cached times are stale
        self._done: dict[int, float] = {}
        self._done_version = -1
        # The capture in progress: (the capturing thread's ident, its stream, its mode), and captures invalidated.
        self._capture: tuple[int, SimStream, str] | None = None
        self.invalidated: list[str] = []  # the unsafe call that invalidated each capture

    # -- the clock and the work -----------------------------------------------------------------

    def advance(self, ms: float) -> None:
        self.now_ms += ms

    def run(self, stream: SimStream, ms: float) -> Op:
        """A kernel of ``ms`` queued on ``stream`` now (``math.inf``: one that never ends, until ``finish``)."""
        return self.enqueue(stream, Op(stream, self.now_ms, length_ms=ms))

    def finish(self, op: Op, ms: float) -> None:
        """A kernel that hung ends after all, ``ms`` after it started."""
        op.length_ms = ms
        self._version += 1

    def enqueue(self, stream: SimStream, op: Op) -> Op:
        stream.ops.append(op)
        self._version += 1
        return op

    def done_at(self, op: Op) -> float:
        """When ``op`` finishes on the device clock (inf: never)."""
        if self._done_version != self._version:
            self._done, self._done_version = {}, self._version
        known = self._done.get(id(op))
        if known is not None:
            return known
        previous = 0.0
        for item in op.stream.ops:  # in order: each starts when the one before it has finished
            end = self._done.get(id(item))
            if end is None:
                start = max(previous, item.queued_ms)
                if item.waits_for is not None:
                    start = max(start, self.done_at(item.waits_for))
                end = start + item.length_ms
                self._done[id(item)] = end
            previous = end
            if item is op:
                return end
        raise ValueError("op is not on its stream")

    # -- graph capture ----------------------------------------------------------------------------

    @contextmanager
    def capture(self, stream: SimStream, mode: str = "global") -> Iterator[None]:
        """``torch.cuda.graph(g, stream=stream)``: this thread captures ``stream`` (its current stream inside)."""
        self._capture = (threading.get_ident(), stream, mode)
        try:
            with self.stream(stream):
                yield
        finally:
            self._capture = None

    def capturing(self, stream: SimStream) -> bool:
        capture = self._capture
        return capture is not None and capture[1] is stream

    def is_current_stream_capturing(self) -> bool:
        capture = self._capture
        if capture is None or capture[0] != threading.get_ident():
            return False
        return self.current_stream() is capture[1]

    def exchange_capture_mode(self, mode: int) -> int:
        """cudaThreadExchangeStreamCaptureMode: this thread's interaction mode (0 global, 1 thread-local, 2 relaxed)
        becomes ``mode``; the previous one is returned."""
        previous = int(getattr(self._threads, "capture_mode", 0))
        self._threads.capture_mode = mode
        return previous

    def unsafe(self, what: str) -> None:
        """A potentially unsafe call: fails, and invalidates the capture, where the runtime would."""
        capture = self._capture
        if capture is None:
            return
        mine = capture[0] == threading.get_ident()
        mode = int(getattr(self._threads, "capture_mode", 0))
        if mine or (capture[2] == "global" and mode == 0):
            self.invalidated.append(what)
            raise RuntimeError(f"CUDA error: operation not permitted when stream is capturing ({what})")

    # -- torch.cuda's names -----------------------------------------------------------------------

    def log(self, what: str, device: int | None) -> None:
        self.calls.append(Call(what, threading.current_thread().name, self.current_device(), device))

    def of(self, *what: str) -> list[Call]:
        return [c for c in self.calls if c.what in what]

    def is_initialized(self) -> bool:
        return True

    def current_device(self) -> int:
        return int(getattr(self._threads, "device", 0))  # a thread that never chose one is on device 0

    def set_device(self, index: int) -> None:
        self._threads.device = index

    def device(self, index: int) -> DeviceScope:
        return DeviceScope(self, index)

    def current_stream(self, device: int | None = None) -> SimStream:
        index = self.current_device() if device is None else device
        self.log("current_stream", index)
        chosen: dict[int, SimStream] = getattr(self._threads, "streams", {})
        return chosen.get(index, self.default[index])

    @contextmanager
    def stream(self, stream: SimStream) -> Iterator[None]:
        """``torch.cuda.stream(s)``: ``s`` is the current stream of its device on this thread inside."""
        chosen: dict[int, SimStream] = getattr(self._threads, "streams", {})
        before = chosen.get(stream.device)
        self._threads.streams = {**chosen, stream.device: stream}
        try:
            yield
        finally:
            restored = dict(self._threads.streams)
            if before is None:
                restored.pop(stream.device, None)
            else:
                restored[stream.device] = before
            self._threads.streams = restored

    def Stream(self, device: int) -> SimStream:  # torch.cuda's name
        return SimStream(self, device, f"side:{device}:{len(self.calls)}")

    def Event(self, enable_timing: bool = False) -> SimEvent:  # torch.cuda's name
        self.log("Event", None)
        return SimEvent(self)

    def memory_stats(self, device: int | None = None) -> dict[str, Any]:
        self.log("memory_stats", self.current_device() if device is None else device)
        return {}
