"""The reporter thread's half of a ``CudaTimeline``: its completed events read into steps on the GPU clock, and
the communication waits in them.

The training thread leaves a queue of entries (``cuda_timeline.py``): phase marks, one event each, and pairs of
events around a wait or a collective.  Read oldest first, and only once every event of an entry has completed
(``query()``, never a synchronisation), the marks advance the GPU clock and open and close the spans of a step
(forward, backward, the optimizer), and each pair's length is communication: exposed where the compute stream
waited, in flight from the collective's issue.  Each span is its length less the exposed communication inside
it, as ``clock.py`` does on the CPU.  Every event read goes back to the pool, the free queue the training thread
takes from.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# What a pending entry is (an int: the cheapest tag to build on the training thread).  The phase marks, each one
# event on the compute stream: (code, event, step number or None).
FORWARD_START, FORWARD_END, OPTIMIZER_START, OPTIMIZER_END, CLOSURE_START, CLOSURE_END, STEP = range(7)
# Pairs of events around a call on one stream: (code, before, after, issued or None, kind, group, on compute).
BLOCKING = 7  # a blocking collective: in flight from before to after; exposed as well where it ran on compute
WAIT = 8  # a wait for a collective: exposed where the compute stream waited; in flight from its issue, if timed
LOST = 9  # the pool ran dry in this step: its marks are incomplete and it is N/A: (LOST, None, None)

Rows = dict[tuple[str, int], list[Any]]  # (kind, id(group)): [kind, group, seconds in flight or None, exposed]


class StepTimes(NamedTuple):
    """One step on the GPU clock, seconds."""

    number: int  # the reporter's count: the first step mark is step 1
    step_s: float  # mark to mark
    forward_s: float | None  # None: no training forward was marked in the step
    backward_s: float | None
    optimizer_s: float | None  # None: no optimizer step in it
    exposed_s: float  # the compute stream waiting for communication


@dataclass
class Harvest:
    """What one read of the completed events gave: the steps, and the communication by kind and group."""

    steps: list[StepTimes] = field(default_factory=list)
    # (kind, group object, seconds in flight or None where not timed, seconds exposed)
    collectives: list[tuple[str, Any, float | None, float]] = field(default_factory=list)


class TimelineReader:
    """Reads a timeline's entries as their events complete; keeps the step being read between calls.

    Handed the timeline's queues: ``pending`` (its entries, oldest first), ``free`` (the pool's events, which
    each event read rejoins) and ``works`` (NCCL works held for their own duration of a collective).
    """

    def __init__(self, pending: deque[tuple[Any, ...]], free: deque[Any], works: deque[tuple[Any, str, Any]]) -> None:
        self._pending, self._free, self._works = pending, free, works
        self.work_timing_error: str | None = None  # NCCL's durations failed: none is asked again
        self._anchor: Any = None  # the newest phase event read, and its time on the GPU clock (s)
        self._anchor_s = 0.0
        self._span = ""  # the open span: "f" forward, "b" backward, "o" optimizer, "" none
        self._span_t0 = 0.0
        self._span_exposed = 0.0  # _exposed when the span opened
        self._exposed = 0.0  # exposed seconds read so far, a running total
        self._step_t0: float | None = None  # the GPU time of the last step mark read
        self._sums = [0.0, 0.0, 0.0]  # forward, backward, optimizer in the step being read
        self._forwards = 0  # training forwards read in that step
        self._optimized = False
        self._step_exposed = 0.0

    @property
    def anchor(self) -> Any:
        """The one event the reader holds between reads (the pool's accounting counts it)."""
        return self._anchor

    def drop(self) -> None:
        """The timeline's events are being dropped: the anchor too."""
        self._anchor = None

    def read(self) -> Harvest:
        """The steps and waits whose events have all completed, oldest first (``CudaTimeline.harvest``, in scope)."""
        out = Harvest()
        rows: Rows = {}
        pending, free = self._pending, self._free
        while pending:
            entry = pending[0]
            code = entry[0]
            if code == LOST:
                pending.popleft()
                self._reset_step()
            elif code < BLOCKING:
                event = entry[1]
                if not event.query():
                    break
                pending.popleft()
                self._phase(code, self._advance(event), entry[2], out.steps)
            else:
                _, before, after, issued, kind, group, on_compute = entry
                if not (after.query() and before.query() and (issued is None or issued.query())):
                    break
                pending.popleft()
                length = max(before.elapsed_time(after) / 1000.0, 0.0)
                exposed = length if on_compute else 0.0
                in_flight = length if code == BLOCKING else None
                if issued is not None:
                    in_flight = max(issued.elapsed_time(after) / 1000.0, exposed)
                    free.append(issued)
                free.append(before)
                free.append(after)
                self._exposed += exposed
                self._step_exposed += exposed
                _add_row(rows, kind, group, in_flight, exposed)
        self._read_works(rows)
        out.collectives = [(kind, group, in_flight, exposed) for kind, group, in_flight, exposed in rows.values()]
        return out

    def _advance(self, event: Any) -> float:
        """The GPU time of a phase event: the previous one's plus the time between them (s)."""
        anchor = self._anchor
        if anchor is not None:
            self._anchor_s += anchor.elapsed_time(event) / 1000.0
            self._free.append(anchor)
        self._anchor = event
        return self._anchor_s

    def _phase(self, code: int, t: float, number: int | None, steps: list[StepTimes]) -> None:
        span = self._span
        if code == FORWARD_START:
            self._close_span(t)
            self._open_span("f", t)
            self._forwards += 1
        elif code == FORWARD_END:
            if span == "f":
                self._close_span(t)
            self._open_span("b", t)
        elif code == OPTIMIZER_START:
            self._close_span(t)
            self._open_span("o", t)
            self._optimized = True
        elif code in (OPTIMIZER_END, CLOSURE_START):
            if span == "o":
                self._close_span(t)
        elif code == CLOSURE_END:  # the closure's backward ends; the optimizer's update follows
            self._close_span(t)
            self._open_span("o", t)
        elif code == STEP:
            self._close_span(t)
            if self._step_t0 is not None and number is not None:
                forward, backward, optimizer = self._sums
                timed = self._forwards > 0
                steps.append(StepTimes(number, max(t - self._step_t0, 0.0), forward if timed else None,
                                       backward if timed else None, optimizer if self._optimized else None,
                                       self._step_exposed))  # fmt: skip
            self._reset_step()
            self._step_t0 = t

    def _open_span(self, span: str, t: float) -> None:
        self._span, self._span_t0, self._span_exposed = span, t, self._exposed

    def _close_span(self, t: float) -> None:
        span = self._span
        if span:
            length = max(t - self._span_t0 - (self._exposed - self._span_exposed), 0.0)
            self._sums["fbo".index(span)] += length
            self._span = ""

    def _reset_step(self) -> None:
        self._span = ""
        self._step_t0 = None
        self._sums = [0.0, 0.0, 0.0]
        self._forwards = 0
        self._optimized = False
        self._step_exposed = 0.0

    def _read_works(self, rows: Rows) -> None:
        """NCCL's own durations of the works that completed (their start and end events, ms)."""
        works = self._works
        while works:
            work, kind, group = works[0]
            if not work.is_completed():
                break
            works.popleft()
            try:
                in_flight = float(work._get_duration()) / 1000.0
            except Exception as exc:  # "getDuration only works if timing was enabled": not for this process
                self.work_timing_error = f"{type(exc).__name__}: {exc}"[:200]
                works.clear()
                return
            _add_row(rows, kind, group, in_flight, 0.0)
            del work  # dropped here, in scope: its events are destroyed with the device current


def _add_row(rows: Rows, kind: str, group: Any, in_flight: float | None, exposed: float) -> None:
    row = rows.get((kind, id(group)))
    if row is None:
        rows[(kind, id(group))] = [kind, group, in_flight, exposed]
        return
    if in_flight is not None:
        row[2] = (row[2] or 0.0) + in_flight
    row[3] += exposed
