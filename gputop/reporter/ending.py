"""How a rank's process ends, for its bye: it finished, a signal ended it, or an exception did (issue #48).

Without it a job stopped by SIGTERM (``scancel``, a container's stop, ``kill``, torchrun passing on its own)
leaves its ranks without a bye, and the dashboard and the fleet cannot tell a cancelled job from a lost node.
``Ending.install()``, on the main thread, wraps two things the script may have set before:

- SIGTERM's handler. A handler of the script's own runs first and as it was, at once: if it returns, the
  process goes on and the reason waits for its real exit. Where the script left Python's default (terminate
  at once, no ``atexit``), the rank sends its last window and its bye first, at most
  ``reporter_thread.EXIT_FLUSH_S`` and a half-second join, then dies of the same signal by the default
  action, so its exit status is what it would have been. A signal the script ignores stays ignored.
- ``sys.excepthook``: an exception that ends the main thread is noted ("RuntimeError: CUDA out of memory";
  Ctrl-C's KeyboardInterrupt as the signal SIGINT), then handed to the hook that was there.

A process killed by SIGKILL or by the kernel says nothing: that is what "lost" means.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, Literal

How = Literal["exit", "signal", "exception"]
DETAIL_CHARS = 200


class Ending:
    """What ended the process, as its bye will say: ``how`` and, for a signal or an exception, ``detail``."""

    def __init__(self) -> None:
        self.how: How = "exit"
        self.detail = ""
        self._flush: Callable[[], None] | None = None
        self._previous_handler: Any = None
        self._previous_hook: Callable[..., Any] | None = None

    def install(self, flush: Callable[[], None]) -> None:
        """Wrap SIGTERM's handler and the exception hook; ``flush`` sends the last window and the bye.  Only on
        the main thread (Python's rule for signal handlers); never raises."""
        self._flush = flush
        with contextlib.suppress(Exception):
            previous_hook = sys.excepthook
            self._previous_hook = previous_hook
            sys.excepthook = self._on_exception
        if threading.current_thread() is not threading.main_thread():
            return
        with contextlib.suppress(Exception):
            previous = signal.getsignal(signal.SIGTERM)
            if previous is signal.SIG_IGN or previous is None:
                return  # ignored, or set outside Python: left as it is
            self._previous_handler = previous
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.how, self.detail = "signal", signal.Signals(signum).name
        previous = self._previous_handler
        if callable(previous):
            previous(signum, frame)  # the script's own, first and as it was; its exit (if any) sends the bye
            return
        with contextlib.suppress(Exception):
            if self._flush is not None:
                self._flush()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # die of it, as the default would have

    def _on_exception(self, kind: type[BaseException], value: BaseException, traceback: TracebackType | None) -> None:
        with contextlib.suppress(Exception):
            if issubclass(kind, KeyboardInterrupt):
                self.how, self.detail = "signal", "SIGINT"  # Ctrl-C: the user stopped it
            else:
                self.how, self.detail = "exception", f"{kind.__name__}: {value}"[:DETAIL_CHARS]
        hook = self._previous_hook or sys.__excepthook__
        hook(kind, value, traceback)
