"""Where the training thread is, sent to a collector that reads it: the reporter thread's side of ``stacks``.

The stack sampler (``stacks.StackSampler``, ``GPUTOP_STACKS``/``GPUTOP_STACKS_HZ``)
runs only while the collector connected now has said it accepts ``stacks``
messages, so with no dashboard, or an older one, it costs nothing.  The
reporter thread wakes for each sample; once every ``STACKS_EVERY_S`` it sends
what was sampled since, with torch's Flight Recorder's last entered collective
when the user turned the recorder on and no step has finished for a while
(``flight_recorder``), and then each process group's collectives numbered
(``collective_numbers``).  A sampler or a recorder that fails is dropped and named
once; reporting goes on without it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from gputop.protocol import Accepts, Collective, GroupCalls, Hello, encode
from gputop.reporter import collective_numbers, flight_recorder, stacks
from gputop.reporter.clock import StepClock
from gputop.reporter.collectives import CollectiveTap
from gputop.reporter.probes.collectives import describe_group
from gputop.reporter.sender import Sender

# Where the training thread was goes up once a second (stacks.SEND_EVERY_S): a 10-s span holds ten, a hang's
# newest place is at most a second old, and a collector of 1,024 ranks reads 1,024 more frames a second, not 2,048.
STACKS_EVERY_S = stacks.SEND_EVERY_S


class StackReporting:
    """The stack sampler and the Flight Recorder's reader of one reporter; every method runs on the reporter thread."""

    def __init__(
        self,
        sender: Sender,
        clock: StepClock,
        train_ident: int,
        *,
        hello: Callable[[], Hello],
        report_error: Callable[[str, BaseException], None],
        tap: CollectiveTap | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        """``hello``: the rank's current hello; ``report_error``: names a failure once, as an event; ``tap``: the
        collective tap, whose numbers per process group go with the stacks while the training thread is stuck."""
        self._sender = sender
        self._clock = clock
        self._tap = tap
        self._hello = hello
        self._report_error = report_error
        hz, self._complaint = stacks.configured_hz(environ)
        self.sampler = None if hz is None else stacks.StackSampler(train_ident, hz=hz, clock=clock)
        self._connection = 0  # the sender's connection count when its collector accepted stacks
        # torch's Flight Recorder, where the user turned it on: read only while the training thread is stuck.
        dump = flight_recorder.dump_function() if flight_recorder.enabled(environ) else None
        self._flight = None if dump is None else flight_recorder.FlightRecorderReader(dump)
        # Asked for, yet this torch has no dump to read: the rank says so once, as a not-measured reason.
        self.flight_missing = dump is None and flight_recorder.enabled(environ)
        self._next_send_s = 0.0
        self.forward_codes: tuple[Any, ...] = ()  # the watched model's forward code (training thread writes)

    def follow(self, train_ident: int) -> None:
        """Sample this thread from now on: the one the model was watched from (the training thread writes)."""
        if self.sampler is not None:
            self.sampler.thread_ident = train_ident

    def accepted(self) -> bool:
        """The collector connected now said it reads stacks messages."""
        return self._sender.connected and self._connection == self._sender.connects

    def wait_s(self, wait_s: float) -> float:
        """``wait_s``, or less when the next stack sample is sooner."""
        if self.sampler is not None and self.accepted():
            wait_s = min(wait_s, self.sampler.next_s - time.monotonic())
        return wait_s

    def sample(self, now_s: float, cpu_before_wake_s: float) -> None:
        """Take a sample when one is due (the thread woke for it, or for a tick)."""
        sampler = self.sampler
        if sampler is None or not self.accepted():
            return
        try:
            if self.forward_codes:
                sampler.watch_forwards(self.forward_codes)
            sampler.sample_when_due(now_s, cpu_before_wake_s)
        except Exception as exc:  # the sampler goes; reporting goes on without it
            self.sampler = None
            self._report_error("stacks", exc)

    def send(self, now_s: float) -> None:
        """Every STACKS_EVERY_S, where the training thread was since the last time, to a collector that reads it."""
        sampler = self.sampler
        if sampler is None or now_s < self._next_send_s or not self.accepted():
            return
        # On a grid, not from now: the ticks come with the windows, and "a second after this tick" would wait
        # for the tick after that (1.5 s) whenever the two grids drift apart.
        self._next_send_s = max(self._next_send_s + STACKS_EVERY_S, now_s)
        cpu_s = time.thread_time()
        hello = self._hello()
        message = sampler.take(hello.run_id, hello.rank, time.time())
        collective = self._last_collective(now_s)
        if collective is not None:
            message = msgspec.structs.replace(message, collective=collective)
        groups = self._groups()
        if groups:
            message = msgspec.structs.replace(message, groups=groups)
        self._sender.enqueue(encode(message), this_connection_only=True)
        sampler.send_cost_s = time.thread_time() - cpu_s  # out of the sampler's budget, from the next second on

    def on_accepts(self, command: Accepts, now_s: float) -> None:
        """The collector named the optional types it reads: start sampling if stacks is one (once per connection)."""
        if "stacks" not in command.types or self.sampler is None or self.accepted():
            return
        self._connection = self._sender.connects
        self.sampler.restart(now_s)
        self._next_send_s = now_s + STACKS_EVERY_S
        if self._complaint:
            self._report_error("stacks_hz", ValueError(self._complaint))

    def _groups(self) -> tuple[GroupCalls, ...] | None:
        """While no step finishes: each process group's numbers (``collective_numbers``); None while stepping."""
        since_step_s = self._clock.since_mark_s()
        if self._tap is None or since_step_s is None or since_step_s < flight_recorder.STUCK_AFTER_S:
            return None
        try:
            tap = self._tap
            return collective_numbers.group_calls(tap, tap.name_group or describe_group) or None
        except Exception as exc:  # read no more
            self._tap = None
            self._report_error("collective_numbers", exc)
            return None

    def _last_collective(self, now_s: float) -> Collective | None:
        """While no step finishes: the Flight Recorder's last entered collective where the user turned it on, else
        the default process group's count of the collectives issued; None while stepping, or on failure."""
        since_step_s = self._clock.since_mark_s()
        if self._flight is not None:
            try:
                return self._flight.read_if_stuck(now_s, since_step_s)
            except Exception as exc:  # a torch without the dump, a malformed one: read no more
                self._flight = None
                self._report_error("flight_recorder", exc)
        return flight_recorder.issued_on_default_group(since_step_s)
