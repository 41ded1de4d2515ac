"""How a rank's process ends, for its bye: it finished, an exception ended it, or Ctrl-C did (issue #48).

``Ending.install()`` wraps ``sys.excepthook``: an exception that ends the main thread is noted ("RuntimeError:
CUDA out of memory"; Ctrl-C's KeyboardInterrupt as the signal SIGINT), then handed to the hook that was there.
The bye the exit sends (``atexit``) says so, and the rank reads "failed: …" or "ended by SIGINT", not "lost".

SIGTERM is not intercepted, by design. A Python handler runs only when the main thread returns to the
interpreter; a rank blocked in a collective (gloo waits holding the GIL, NCCL's `wait()` in C++) would then
ignore the SIGTERM that ``scancel``, a container's stop or torchrun send a hung job, until their SIGKILL 30 s
later, where the default action ends it at once. The test that caught it: a 4-rank job over two network
namespaces whose node-a ranks, blocked in the exchange with a lost node, no longer died on SIGTERM
(tests/integration/test_multi_host.py). A SIGTERMed rank therefore still reads "lost"; telling it from a
vanished one needs its launcher's word (docs/diagnosis.md#hang).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal

How = Literal["exit", "signal", "exception"]
DETAIL_CHARS = 200


class Ending:
    """What ended the process, as its bye will say: ``how`` and, for a signal or an exception, ``detail``."""

    def __init__(self) -> None:
        self.how: How = "exit"
        self.detail = ""
        self._previous_hook: Callable[..., Any] | None = None

    def install(self) -> None:
        """Wrap the exception hook (any thread may call it: it is the interpreter's, not a signal's).  Never
        raises."""
        with contextlib.suppress(Exception):
            self._previous_hook = sys.excepthook
            sys.excepthook = self._on_exception

    def _on_exception(self, kind: type[BaseException], value: BaseException, traceback: TracebackType | None) -> None:
        with contextlib.suppress(Exception):
            if issubclass(kind, KeyboardInterrupt):
                self.how, self.detail = "signal", "SIGINT"  # Ctrl-C: the user stopped it
            else:
                self.how, self.detail = "exception", f"{kind.__name__}: {value}"[:DETAIL_CHARS]
        hook = self._previous_hook or sys.__excepthook__
        hook(kind, value, traceback)
