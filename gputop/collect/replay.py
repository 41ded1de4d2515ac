"""A replay snapshot source: a recording fed into a store at the recorded pace (or faster)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from gputop.collect import recording
from gputop.collect.store import Store
from gputop.model.snapshot import SNAPSHOT_HISTORY_WINDOWS, SPAN_COPY_WINDOWS, Snapshot


class ReplaySource:
    """Plays a recording; its clock is the recording's, scaled by ``speed``.

    The file is read up front (so a bad file fails before the UI opens) and
    its entries are applied on a daemon thread as the replay clock reaches them.
    """

    kind = "replay"

    def __init__(self, path: Path, *, speed: float = 1.0) -> None:
        self.path = path
        self.speed = max(speed, 1e-3)
        self.stats = recording.ReadStats()
        self._entries = sorted(recording.read(path, self.stats), key=lambda e: e.t)
        self.store = Store(lost_after_s=self.stats.lost_after_s)  # merged windows come seconds apart
        self.store.listen = f"replay of {path}"
        self._start_t = self._entries[0].t if self._entries else 0.0
        self._end_t = self._entries[-1].t if self._entries else 0.0
        self._wall0 = 0.0
        self._done = threading.Event()
        self._stop = threading.Event()
        self.focus: frozenset[str] = frozenset()  # rank keys whose whole history the UI shows
        self._thread = threading.Thread(target=self._play, name="gputop-replay", daemon=True)

    @property
    def description(self) -> str:
        speed = f" at {self.speed:g}x" if self.speed != 1 else ""
        return f"replay of {self.path.name}{speed}"

    def start(self) -> None:
        """Start playing (idempotent)."""
        if self._thread.is_alive() or self._done.is_set():
            return
        self._wall0 = time.monotonic()
        self._thread.start()

    def clock(self) -> float:
        """The recording time being shown now."""
        played = (time.monotonic() - self._wall0) * self.speed
        return min(self._start_t + played, self._end_t)

    def snapshot(self) -> Snapshot:
        return self.store.snapshot(
            self.clock(), history=SPAN_COPY_WINDOWS, full=self.focus, full_history=SNAPSHOT_HISTORY_WINDOWS
        )

    def stop(self) -> None:
        self._stop.set()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def _play(self) -> None:
        for entry in self._entries:
            while not self._stop.is_set():
                ahead_s = (entry.t - self.clock()) / self.speed
                if ahead_s <= 0:
                    break
                self._stop.wait(min(ahead_s, 0.1))
            if self._stop.is_set():
                return
            recording.apply(self.store, entry)
        self._done.set()
