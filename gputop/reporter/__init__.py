"""Runs inside every training process.  Imports torch lazily; never textual.

The public functions never raise into training: a failure inside gputop
disables it for the process and leaves the training loop as it was.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterable
from typing import Any, TypeVar

from gputop import settings
from gputop.address import AddressError, resolve
from gputop.reporter.clock import TrackedLoader
from gputop.reporter.reporter import Reporter

T = TypeVar("T")

_lock = threading.Lock()
_reporter: Reporter | None = None
_broken = False  # set when starting failed: gputop is a no-op from then on


def _disabled() -> bool:
    return _broken or settings.DISABLE.value()


def _warn(message: str) -> None:
    with contextlib.suppress(Exception):
        sys.stderr.write(f"gputop: {message}; reporting is off for this process\n")


def _get() -> Reporter | None:
    """The process's reporter, started on first use; None when disabled."""
    global _reporter, _broken
    if _disabled():
        return None
    reporter = _reporter
    if reporter is not None:  # a forked child (DataLoader worker) never reports (a flag: getpid is a system call)
        return None if reporter._forked or reporter.pid != os.getpid() else reporter
    with _lock:
        if _reporter is None:
            try:
                _reporter = Reporter(resolve(), window_s=settings.WINDOW_S.value())
                _reporter.start()
            except (AddressError, settings.SettingError) as exc:
                _broken = True
                _warn(str(exc))
                return None
            except Exception as exc:
                _broken = True
                _warn(f"could not start ({type(exc).__name__}: {exc})")
                return None
    return _reporter


def watch(model: Any = None) -> Reporter | None:
    """Start reporting for this process; hook the model (DDP or plain) if given.

    Steps are counted from ``optimizer.step()`` of any optimizer (the first one
    seen stands for the step).  Calling it again is harmless.
    """
    reporter = _get()
    if reporter is not None:
        try:
            reporter.attach_model(model)
        except Exception as exc:
            _warn(f"could not watch {type(model).__name__} ({exc})")
    return reporter


def track(loader: Iterable[T]) -> Iterable[T]:
    """Yield the loader's batches, timing how long each one was waited for."""
    reporter = _get()
    if reporter is None:
        return loader
    try:
        reporter.attach_loader(loader)
        return TrackedLoader(loader, reporter.clock)
    except Exception:
        return loader


def add_loader_wait(seconds: float) -> None:
    """Count time spent waiting for input, for loops that fetch batches themselves (Lightning)."""
    reporter = _get()
    if reporter is not None:
        with contextlib.suppress(Exception):
            reporter.clock.add_loader_wait(float(seconds))


def log_to(writer: Any, every_s: float = 10.0) -> None:
    """Log this rank's step breakdown into a TensorBoard ``SummaryWriter`` (or anything with ``add_scalar``).

    The reporter thread writes ``gputop/rank<R>/…`` scalars every ``every_s``
    seconds at the rank's step count, so they line up with a loss logged per
    step.  The training thread does nothing for it.
    """
    reporter = _get()
    if reporter is not None:
        with contextlib.suppress(Exception):
            reporter.log_to(writer, max(float(every_s), 0.5))


def figures() -> dict[str, float]:
    """This rank's recent step breakdown as logger keys; {} when gputop is off or nothing was measured yet."""
    reporter = _get()
    if reporter is None:
        return {}
    try:
        return reporter.figures()
    except Exception:
        return {}


def step() -> None:
    """Mark the end of a training step by hand (then optimizer steps no longer count)."""
    reporter = _reporter  # once started, as the optimizer's hooks do: no environment read per step
    if reporter is None or reporter._forked or _broken:
        reporter = _get()
    if reporter is not None:
        reporter.mark_step()


def _after_fork_in_child() -> None:
    # DataLoader workers are forked from a rank: they inherit the reporter object
    # but not its thread.  They must never report or touch the parent's socket.
    global _reporter, _broken
    if _reporter is not None:
        _broken = True


os.register_at_fork(after_in_child=_after_fork_in_child)
