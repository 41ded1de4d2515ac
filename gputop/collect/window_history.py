"""One rank's windows, oldest first, the newest as objects and the older ones encoded.

A window decoded is about 1.2 KiB of Python objects (a 46-slot struct, its
floats, two dicts); encoded as msgpack it is a 0.45-KiB ``bytes``.  A live
refresh copies only each rank's newest ``SPAN_COPY_WINDOWS`` (the figures'
span and its margin), so those stay objects; older windows are read only for
the rank whose history is on screen and for the report, and are decoded then.
At 1,024 ranks that is 106 of each rank's 146 windows: the store holds 150,000
windows in about 100 MiB instead of 175.  Lossless: a decoded window equals
the one stored, so every figure and history reads the same numbers.

The rank on screen has its older windows read on every refresh, twice a
second; what was decoded for the last read is kept for the next (one rank's
few hundred windows), and let go when a read needs no decoding.
"""

from __future__ import annotations

import itertools
from collections import deque

import msgspec

from gputop.model.snapshot import SPAN_COPY_WINDOWS
from gputop.protocol import Window

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Window)


class WindowHistory:
    """A rank's newest ``maxlen`` windows (None: all), of which the newest ``objects`` kept decoded."""

    def __init__(self, maxlen: int | None, *, objects: int = SPAN_COPY_WINDOWS) -> None:
        self.maxlen = maxlen
        self._objects = objects
        self._newest: deque[Window] = deque()
        self._older: deque[bytes] = deque()  # encoded, oldest first
        # The older windows decoded for the last bounded read, by their encoding's id (the encoding
        # kept with them, so that id stays theirs): the next read decodes only what is new to it.
        self._decoded: dict[int, tuple[bytes, Window]] = {}

    def __len__(self) -> int:
        return len(self._newest) + len(self._older)

    def append(self, window: Window) -> None:
        self._newest.append(window)
        if len(self._newest) > self._objects:
            self._older.append(_ENCODER.encode(self._newest.popleft()))
        self._trim()

    def shorten(self, maxlen: int) -> None:
        """Keep at most ``maxlen`` windows from now on, dropping the oldest beyond it now."""
        self.maxlen = maxlen
        self._trim()

    def _trim(self) -> None:
        while self.maxlen is not None and len(self) > self.maxlen:
            (self._older or self._newest).popleft()

    def newest(self, n: int | None = None) -> tuple[Window, ...]:
        """The newest ``n`` windows (None: all), oldest first; older ones decoded afresh."""
        if n is not None and n <= 0:
            return ()
        objects = len(self._newest)
        if n is not None and n <= objects:
            self._decoded.clear()
            return tuple(itertools.islice(self._newest, objects - n, None))
        older = len(self._older) if n is None else min(n - objects, len(self._older))
        blobs = itertools.islice(self._older, len(self._older) - older, None)
        if n is None:  # everything, for a report: read once, nothing kept
            self._decoded.clear()
            return (*(_DECODER.decode(blob) for blob in blobs), *self._newest)
        last, kept = self._decoded, {}
        for blob in blobs:
            hit = last.get(id(blob))
            kept[id(blob)] = hit if hit is not None and hit[0] is blob else (blob, _DECODER.decode(blob))
        self._decoded = kept
        return (*(window for _, window in kept.values()), *self._newest)
