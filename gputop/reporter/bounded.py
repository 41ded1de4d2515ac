"""A call the reporter thread waits for at most a bound: one that may block on a lock the training thread holds.

DDP's ``_get_ddp_logging_data()`` takes the reducer's lock, which the training thread holds while DDP's backward
waits for its gradient all-reduce.  In a hang (a peer that never joins) that wait never ends, and a reporter
thread that read DDP there went silent with it: no windows, no stack samples, no collective numbers, exactly when
they say the most (issue #55).  ``BoundedCall`` runs such a call on a daemon thread of its own and waits for it at
most ``bound_s``; while a call is still blocked the next one is not started (one thread, never a pile of them),
and the caller is told it is busy.  Never raises anything of its own.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from gputop.processes.procfs import name_this_thread


class Busy(Exception):
    """The call did not return within the bound, or an earlier one is still blocked."""


class _Call:
    __slots__ = ("done", "error", "fn", "result")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class BoundedCall:
    """``call(fn)``: ``fn()`` on this object's thread, its result within ``bound_s``, else ``Busy``."""

    def __init__(self, name: str, bound_s: float) -> None:
        self.name = name
        self.bound_s = bound_s
        self._calls: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._last: _Call | None = None

    @property
    def blocked(self) -> bool:
        """Whether the last call has not returned yet."""
        return self._last is not None and not self._last.done.is_set()

    def call(self, fn: Callable[[], Any]) -> Any:
        if self.blocked:
            raise Busy(f"{self.name}: the last call has not returned")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        call = self._last = _Call(fn)
        self._calls.put(call)
        if not call.done.wait(self.bound_s):
            raise Busy(f"{self.name}: no return within {self.bound_s:g} s")
        if call.error is not None:
            raise call.error
        return call.result

    def _run(self) -> None:
        name_this_thread(self.name)
        while True:
            call = self._calls.get()
            try:
                call.result = call.fn()
            except BaseException as exc:  # handed to the caller, who may have stopped waiting
                call.error = exc
            finally:
                call.done.set()
