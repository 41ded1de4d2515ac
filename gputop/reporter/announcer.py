"""What a rank says about itself: its hello, kept to the facts the training thread learned, and the events it
says once (a part that failed, a figure not measured and why, a note such as a recompile).

The reporter thread's (the first hello is built on the training thread, before that thread starts; a trainer's
logger may ask for the hello from any thread).  Every frame goes into the sender's queue: nothing here blocks.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gputop import __version__
from gputop.protocol import Bye, Event, Hello, encode
from gputop.reporter import facts
from gputop.reporter.probes import Probe
from gputop.reporter.sender import Sender
from gputop.reporter.training_side import TrainingSide


class Announcer:
    """The rank's hello and its once-said events, through ``sender``.

    ``step_total``: the steps the rank has reported, for the bye its old name says when it learns its real one.
    """

    def __init__(self, sender: Sender, side: TrainingSide, step_total: Callable[[], int]) -> None:
        self.sender = sender
        self._side = side
        self._step_total = step_total
        self._hello: Hello | None = None
        self.failed_probes: set[str] = set()  # the parts that failed, each named once (their columns are N/A)
        self._reasons_said: set[tuple[str, str]] = set()  # (probe, why not measured), each sent once

    def hello(self) -> Hello:
        """The rank's current hello, built on first use."""
        if self._hello is None:
            self.refresh_hello()
        assert self._hello is not None
        return self._hello

    def refresh_hello(self) -> None:
        """Rebuild the hello from the facts; the sender says it on every (re)connection."""
        side = self._side
        # A copy: the training thread adds facts (autocast, the loader) while we read them.
        hello = facts.build_hello(dict(side.facts), side.window_s, side.started_t, __version__)
        if hello == self._hello:
            return
        old, self._hello = self._hello, hello
        if old is not None and (old.run_id, old.rank) != (hello.run_id, hello.rank):
            # The rank learned its real name (init_process_group ran after track() or step()).
            # Queued frames carry the old name: on a reconnect they would follow the new
            # hello and be refused, so they go; on a live connection the old name says bye.
            if self.sender.connected:
                bye = Bye(run_id=old.run_id, rank=old.rank, t=time.time(), step_total=self._step_total())
                self.sender.enqueue(encode(bye))
            else:
                self.sender.forget_queued()
        self.sender.set_hello(encode(hello))

    def report_error(self, probe: str, exc: BaseException) -> None:
        """Name a part's failure once, as an ``error`` event; it stays failed."""
        if probe in self.failed_probes:
            return
        self.failed_probes.add(probe)
        hello = self.hello()
        message = f"{probe}: {type(exc).__name__}: {exc}"[:500]
        self.sender.enqueue(
            encode(Event(run_id=hello.run_id, rank=hello.rank, t=time.time(), kind="error", message=message))
        )

    def send_event(self, kind: str, message: str) -> None:
        hello = self.hello()
        self.sender.enqueue(
            encode(Event(run_id=hello.run_id, rank=hello.rank, t=time.time(), kind=kind, message=message[:500]))
        )

    def say_why_not_measured(self, probe: Probe) -> None:
        """A probe's reason for N/A fields, sent once per reason as a ``not_measured`` event: "<probe>: <why>"."""
        self.say_not_measured(probe.name, probe.not_measured)

    def say_not_measured(self, name: str, reason: str | None) -> None:
        if not reason or (name, reason) in self._reasons_said:
            return
        self._reasons_said.add((name, reason))
        hello = self.hello()
        message = f"{name}: {reason}"[:500]
        self.sender.enqueue(
            encode(Event(run_id=hello.run_id, rank=hello.rank, t=time.time(), kind="not_measured", message=message))
        )
