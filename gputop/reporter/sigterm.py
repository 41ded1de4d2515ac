"""A bye on SIGTERM that delays nothing: the rank says "ended by SIGTERM", then dies of it (issue #48).

SIGTERM is what ``scancel``, a container's stop, ``kill`` and torchrun send a job.  Its default action ends
the process at once, wherever its threads are: in a collective, in C++, holding the GIL.  A Python handler
alone would not do: it runs only when the main thread is back in the interpreter, and a rank blocked in a
collective never is, so it would outlive the SIGTERM until the SIGKILL that follows 30 s later (what
tests/integration/test_multi_host.py caught once).  So, and only where SIGTERM has its default action (a
script's own handler, or an ignored SIGTERM, is left as it is and nothing here runs):

- Python's handler is installed for SIGTERM, and the write end of a pipe of ours made the interpreter's wakeup
  fd (``signal.set_wakeup_fd``; only where nobody holds it: asyncio's loop does when it handles signals).  The
  interpreter's C-level handler writes the signal's number there the moment SIGTERM arrives, whatever the main
  thread is doing.
- A daemon thread of ours waits on the pipe (a blocked ``read()``, no CPU).  On SIGTERM it notes the ending,
  asks the reporter for the last window and the bye (``say_bye``, bounded by ``BYE_S``: the reporter thread's,
  or the bye alone on a connection of its own where that thread is stuck), resets SIGTERM
  to its default action in C (libc's ``signal()``: ``signal.signal`` is the main thread's only) and sends
  SIGTERM to the process again, which then dies of it as it would have: wait status "killed by signal 15",
  143 under a launcher.  If the main thread reaches the Python handler first, it does the same; whichever
  comes first acts, the other returns.

What could leave the rank alive after SIGTERM, and what keeps it from happening:

- the wakeup fd taken after us (asyncio's ``add_signal_handler``, a GUI loop): ``signal.set_wakeup_fd`` is
  wrapped, and whoever sets another fd puts SIGTERM back to its default action first;
- a handler the script sets after us: the thread sees the handler is no longer ours and leaves SIGTERM to it,
  and ours, if theirs calls it as the one before (Lightning's does, to stop training on its own terms, or to
  outlive SIGTERM for SLURM's requeue), does nothing, as the default it stands for would not be called;
- a child forked from the rank (a DataLoader worker) inherits the handler and the wakeup fd: both are reset in
  it (``os.register_at_fork``), and only the process that installed them acts;
- the interpreter's exit: the reporter's shutdown calls ``uninstall`` once its exit bye has left (a SIGTERM
  meanwhile, a launcher's after a peer died, waits for that bye within ``BYE_S``), so a rank stuck in its
  teardown (a process group's destructor) dies of SIGTERM at once, as before;
- a main thread that holds the GIL while it blocks, in a C extension that never lets go of it: the thread
  cannot run until it does.  torch's collectives let go of it while they wait: measured, a thread of a gloo
  rank kept running every 50 ms while its main thread waited 3 s in an all-reduce and in DDP's backward, and
  a rank blocked in DDP's exchange with a peer cut off the network died 0.37 s after SIGTERM, its bye sent
  on a connection of its own (its reporter thread waits on DDP's lock there, in the DDP probe's read).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from gputop.reporter.ending import Ending

BYE_S = 0.5  # the most SIGTERM waits for its bye to leave (reporter.py: two ways) before the process dies of it


class SigtermBye:
    """Installed by ``install()`` on the main thread; ``say_bye(bound_s)`` sends the last window and the bye."""

    def __init__(self, ending: Ending, say_bye: Callable[[float], None]) -> None:
        self._ending = ending
        self._say_bye = say_bye
        self._pid = os.getpid()
        self._installed = False
        self._acting = threading.Lock()  # taken by whichever of the thread and the handler acts first
        self._handler = self._on_main_thread  # one bound method, so that ``is`` tells it from a script's
        self._pipe: tuple[int, int] | None = None  # (read, write): the wakeup fd's pipe
        self._c_signal: Any = None  # libc's signal(), resolved at install: nothing is loaded at SIGTERM
        self._set_wakeup_fd: Callable[..., int] = signal.set_wakeup_fd  # the interpreter's own
        self.why_not = ""  # why it was not installed: "" once it is

    @property
    def installed(self) -> bool:
        return self._installed

    def install(self) -> bool:
        """Handle SIGTERM where it has its default action and the wakeup fd is free; on the main thread only.
        Whether it did: otherwise ``why_not`` says why, and SIGTERM is left as it was.  Never raises."""
        try:
            self.why_not = self._why_not_here()
            if not self.why_not:
                self._install()
        except Exception as exc:
            self.why_not = f"{type(exc).__name__}: {exc}"
        return self._installed

    def _why_not_here(self) -> str:
        if threading.current_thread() is not threading.main_thread():
            return "gputop was started off the main thread, where Python cannot set a signal's handler"
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return "the script handles SIGTERM itself (or ignores it): its handler is left as it is"
        c_signal = ctypes.CDLL(None, use_errno=True).signal
        c_signal.argtypes, c_signal.restype = (ctypes.c_int, ctypes.c_void_p), ctypes.c_void_p
        self._c_signal = c_signal
        return ""

    def _install(self) -> None:
        read_fd, write_fd = os.pipe()  # close-on-exec, as every fd Python makes
        os.set_blocking(write_fd, False)  # the interpreter's handler must never block on it
        held = self._set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        if held != -1:  # someone else's (an asyncio loop's): theirs stays, and SIGTERM keeps its default
            self._set_wakeup_fd(held)
            os.close(read_fd)
            os.close(write_fd)
            self.why_not = "the interpreter's signal wakeup fd is another's (an asyncio loop's)"
            return
        self._pipe = (read_fd, write_fd)
        try:  # the thread first: a handler of ours without it would wait for the interpreter, as the first one did
            threading.Thread(target=self._watch, args=(read_fd,), name="gputop-sigterm", daemon=True).start()
        except Exception:
            self._set_wakeup_fd(-1)
            raise
        signal.signal(signal.SIGTERM, self._handler)
        self._installed = True
        signal.set_wakeup_fd = self._wakeup_fd_taken
        os.register_at_fork(after_in_child=self._forget_in_child)

    def uninstall(self) -> None:
        """SIGTERM back to its default action (at the interpreter's exit, before its teardown); the thread is left
        waiting on its pipe, with nothing to do.  Any thread.  Never raises."""
        if not self._installed:
            return
        if self._acting.locked() and os.getpid() == self._pid:
            self._wait_for_the_end()  # SIGTERM's bye is under way: the process is to die of it
        self._installed = False
        with contextlib.suppress(Exception):
            if signal.set_wakeup_fd == self._wakeup_fd_taken:
                signal.set_wakeup_fd = self._set_wakeup_fd
        with contextlib.suppress(Exception):
            if signal.getsignal(signal.SIGTERM) is self._handler:
                self._default()

    # -- SIGTERM arrives ---------------------------------------------------------------

    def _watch(self, read_fd: int) -> None:
        """The thread: wait for a signal's number on the pipe; on SIGTERM, while the handler is ours, act."""
        while True:
            try:
                received = os.read(read_fd, 64)
            except InterruptedError:
                continue
            except OSError:
                return
            if not received:
                return
            if signal.SIGTERM in received and self._installed and signal.getsignal(signal.SIGTERM) is self._handler:
                self._act()

    def _on_main_thread(self, signum: int, frame: FrameType | None) -> None:
        """Python's handler, when the main thread gets there first (it was in the interpreter).  A handler set
        after ours that calls it as the one before (Lightning's does) gets nothing done: SIGTERM is theirs, as it
        would be had the default been there, which no handler calls.  Where it is ours but not to act on (a
        forked child, the interpreter's exit), it does what the default would: the process dies of SIGTERM."""
        if signal.getsignal(signal.SIGTERM) is not self._handler:
            return
        if os.getpid() == self._pid and self._installed:
            self._act()
        else:
            self._die()

    def _act(self) -> None:
        """Say bye within ``BYE_S``, then die of SIGTERM by its default action.  Once: a second caller waits for
        the first to end the process."""
        if not self._acting.acquire(blocking=False):
            self._wait_for_the_end()
            return
        with contextlib.suppress(Exception):
            self._ending.how, self._ending.detail = "signal", "SIGTERM"
            self._say_bye(BYE_S)
        self._die()

    def _wait_for_the_end(self) -> None:
        """Another thread is saying SIGTERM's bye and ends the process within ``BYE_S``: wait for it, so that
        this one does not end it first another way (the exception a peer's death raises in a collective, the
        script's own exit: with status 1 or 0, not SIGTERM's); if it has not by then, die here."""
        self._acting.acquire(timeout=BYE_S + 1.0)
        self._die()

    def _die(self) -> None:
        self._default()
        os.kill(os.getpid(), signal.SIGTERM)

    def _default(self) -> None:
        """SIGTERM's default action back: through Python on the main thread, in C elsewhere (Python refuses)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        else:
            self._c_signal(signal.SIGTERM, signal.SIG_DFL)

    # -- others' ways in ---------------------------------------------------------------

    def _wakeup_fd_taken(self, fd: int, /, **kwargs: Any) -> int:
        """``signal.set_wakeup_fd`` while ours is set: another fd set there puts SIGTERM back to its default
        first (our thread would no longer hear it), then is set as asked."""
        if self._installed and self._pipe is not None and fd != self._pipe[1]:
            self.uninstall()
        return self._set_wakeup_fd(fd, **kwargs)

    def _forget_in_child(self) -> None:
        """In a forked child (a DataLoader worker): SIGTERM's default back, the wakeup fd no longer our pipe."""
        if os.getpid() == self._pid or self._pipe is None:
            return
        self.uninstall()
        with contextlib.suppress(Exception):
            held = self._set_wakeup_fd(-1)
            if held != self._pipe[1]:
                self._set_wakeup_fd(held)  # set in the parent after us, by someone else: theirs
            for fd in self._pipe:
                os.close(fd)
