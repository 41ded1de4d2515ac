"""A daemon thread that runs one function at a fixed period until stopped.

The samplers use it.  Periods are kept on a monotonic schedule (a slow tick
delays the next one, it does not shift every later one), and an exception from
the function is swallowed: a sampler's bug must cost one sample, not the
dashboard.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from gputop.processes.procfs import name_this_thread


class PeriodicThread:
    """Calls ``tick()`` now and then every ``interval_s`` on a daemon thread."""

    def __init__(
        self,
        name: str,
        interval_s: float,
        tick: Callable[[], None],
        *,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.interval_s = interval_s
        self._tick = tick
        self._on_stop = on_stop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.errors = 0  # ticks that raised; readable for tests and a debug view

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Ask the thread to finish and wait up to ``timeout_s`` for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        name_this_thread(self._thread.name)
        next_t = time.monotonic()
        try:
            while not self._stop.is_set():
                try:
                    self._tick()
                except Exception:
                    self.errors += 1
                next_t += self.interval_s
                now = time.monotonic()
                if next_t < now:  # fell behind (a suspended laptop, a stuck driver): restart the schedule
                    next_t = now
                self._stop.wait(next_t - now)
        finally:
            if self._on_stop is not None:
                with contextlib.suppress(Exception):  # shutting down; nothing to report it to
                    self._on_stop()
