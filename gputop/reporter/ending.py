"""How a rank's process ends, for its bye: it finished, a signal ended it, or an exception did (issue #48).

``Ending.install()`` wraps ``sys.excepthook``: an exception that ends the main thread is noted ("RuntimeError:
CUDA out of memory"; Ctrl-C's KeyboardInterrupt as the signal SIGINT), then handed to the hook that was there.
The bye the exit sends (``atexit``) says so, and the rank reads "failed: …" or "ended by SIGINT", not "lost".

SIGTERM (``scancel``, a container's stop, ``kill``, torchrun) is noted by ``sigterm.SigtermBye``, which sends
the bye and lets the process die of the signal within half a second, wherever its main thread is: a Python
handler alone would wait for the interpreter, which a rank blocked in a collective never reaches, until the
SIGKILL 30 s later (tests/integration/test_multi_host.py caught a first handler that did).  A signal noted
first stays the reading: the exception a peer's end then raises in a collective is its consequence.  A rank
killed by SIGKILL, the OOM killer or a lost node says nothing: that, and only that, reads "lost".
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
            if self.how == "signal":
                pass  # SIGTERM came first; this is what it set off (a peer's collective, gone with its rank)
            elif issubclass(kind, KeyboardInterrupt):
                self.how, self.detail = "signal", "SIGINT"  # Ctrl-C: the user stopped it
            else:
                self.how, self.detail = "exception", f"{kind.__name__}: {value}"[:DETAIL_CHARS]
        hook = self._previous_hook or sys.__excepthook__
        hook(kind, value, traceback)
