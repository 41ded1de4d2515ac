"""Recordings: every message received plus GPU and host samples, one JSON object per line.

The first line is a header (``{"type": "recording", ...}``).  Reporter messages
are stored as their protocol objects with ``recv_t`` added; samples as
``{"type": "gpu"|"node_gpu"|"host", ...}`` (``node_gpu``: another host's GPUs,
with its ``hostname``); a rank's connection ending as
``{"type": "disconnect", ...}``.  Each line is flushed as it is written, so a
recorder killed at any moment leaves a file whose complete lines all read back.

A path ending in ``.gz`` is written as one gzip stream, sync-flushed every
``GZIP_FLUSH_S``: what was flushed decompresses even when the recorder is killed
before the stream's end (a kill loses at most the last couple of seconds), and
``read`` takes either kind of file.

Old windows merge: from ``merge_after_s`` into the recording on, each rank's
windows are merged (``gputop.combine.merge_windows``) into one per ``merge_s`` before they
are written, so a day-long run keeps its first minutes at full resolution and
the rest at a twentieth of the lines.  The header says so, and readers widen the
"lost after silence" limit to match.  Stack samples (``stacks``, one a second)
merge the same way (``gputop.model.frames.merge_stacks``).
"""

from __future__ import annotations

import gzip
import io
import json
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gputop import __version__
from gputop.collect.store import LOST_AFTER_S, Store
from gputop.combine import merge_windows
from gputop.model.frames import merge_stacks
from gputop.model.samples import (
    GpuSample,
    HostSample,
    gpu_sample_from_dict,
    host_sample_from_dict,
    sample_to_dict,
)
from gputop.protocol import Bye, Message, ProtocolError, Stacks, Window, from_dict, to_dict

RECORDING_VERSION = 1
MERGE_S = 10.0  # a merged window: 20 reporter windows
GZIP_FLUSH_S = 2.0  # how much a killed compressed recording can lose; each flush costs some ratio


class RecordingError(Exception):
    """A file that is not a gputop recording; the message is one line for the user."""


class Recorder:
    """Appends to a recording; safe to call from the collector and sampler threads."""

    def __init__(
        self, path: Path, *, source: str, merge_after_s: float | None = None, merge_s: float = MERGE_S
    ) -> None:
        """``merge_after_s``: merge windows into ``merge_s`` ones from that far into the recording (None: never)."""
        self._gzip: gzip.GzipFile | None = None
        try:
            if path.suffix == ".gz":
                self._gzip = gzip.GzipFile(path, "wb", compresslevel=6)
                self._file: IO[str] = io.TextIOWrapper(self._gzip, encoding="utf-8")
            else:
                self._file = open(path, "w", encoding="utf-8", buffering=1)  # noqa: SIM115
        except OSError as exc:
            raise RecordingError(f"cannot write {path}: {exc.strerror}") from None
        self._flushed_t = time.monotonic()
        self._lock = threading.Lock()
        self.lines = 0
        self.started_t = time.time()
        self.merge_after_s, self.merge_s = merge_after_s, merge_s
        self._pending: dict[tuple[str, int], list[tuple[Window, float]]] = {}  # windows waiting to be merged
        self._pending_stacks: dict[tuple[str, int], list[tuple[Stacks, float]]] = {}  # and stack samples
        header: dict[str, object] = {
            "type": "recording",
            "version": RECORDING_VERSION,
            "gputop_version": __version__,
            "started_t": self.started_t,
            "source": source,
        }
        if merge_after_s is not None:
            header |= {"merge_after_s": merge_after_s, "merge_s": merge_s}
        self._write(header)

    def message(self, message: Message, recv_t: float) -> None:
        key = (message.run_id, message.rank)
        if isinstance(message, Window) and self._merging(key, recv_t):
            with self._lock:
                pending = self._pending.setdefault(key, [])
                pending.append((message, recv_t))
                if message.t1 - pending[0][0].t0 < self.merge_s:
                    return
            self._flush_merged(key)
            return
        if isinstance(message, Stacks) and self._merging_stacks(key, recv_t):
            with self._lock:
                pending_stacks = self._pending_stacks.setdefault(key, [])
                pending_stacks.append((message, recv_t))
                first = pending_stacks[0][0]
                if message.t - (first.t - first.period_s) < self.merge_s:
                    return
            self._flush_merged(key)
            return
        if isinstance(message, Bye):
            self._flush_merged(key)
        self._write({**to_dict(message), "recv_t": recv_t})

    def _merging(self, key: tuple[str, int], recv_t: float) -> bool:
        if self.merge_after_s is None:
            return False
        return recv_t - self.started_t >= self.merge_after_s or key in self._pending

    def _merging_stacks(self, key: tuple[str, int], recv_t: float) -> bool:
        if self.merge_after_s is None:
            return False
        return recv_t - self.started_t >= self.merge_after_s or key in self._pending_stacks

    def _flush_merged(self, key: tuple[str, int]) -> None:
        with self._lock:
            pending = self._pending.pop(key, [])
            pending_stacks = self._pending_stacks.pop(key, [])
        if pending:
            merged = merge_windows([w for w, _ in pending])
            self._write({**to_dict(merged), "recv_t": pending[-1][1]})
        if pending_stacks:
            stacks = merge_stacks([s for s, _ in pending_stacks])
            self._write({**to_dict(stacks), "recv_t": pending_stacks[-1][1]})

    def sample(self, sample: GpuSample | HostSample) -> None:
        self._write(sample_to_dict(sample))

    def disconnect(self, run_id: str, rank: int, reason: str, t: float, pid: int = 0) -> None:
        self._flush_merged((run_id, rank))
        self._write({"type": "disconnect", "run_id": run_id, "rank": rank, "reason": reason, "t": t, "pid": pid})

    def close(self) -> None:
        for key in {*self._pending, *self._pending_stacks}:
            self._flush_merged(key)
        with self._lock:
            self._file.close()

    def _write(self, obj: dict[str, object]) -> None:
        line = json.dumps(obj, separators=(",", ":")) + "\n"
        with self._lock:
            if not self._file.closed:
                self._file.write(line)
                self.lines += 1
                if self._gzip is not None and time.monotonic() - self._flushed_t >= GZIP_FLUSH_S:
                    self._file.flush()
                    self._gzip.flush(zlib.Z_SYNC_FLUSH)  # a byte-aligned point a reader can stop at
                    self._gzip.fileobj.flush()  # type: ignore[union-attr]
                    self._flushed_t = time.monotonic()


@dataclass(frozen=True)
class Entry:
    """One line of a recording, decoded."""

    t: float  # when it was received or sampled
    kind: str  # "message", "gpu", "node_gpu", "host", "disconnect"
    value: Any  # a protocol Message, GpuSample, HostSample, or (run_id, rank, reason, pid)


@dataclass
class ReadStats:
    lines: int = 0
    skipped: int = 0  # damaged lines (a killed recorder's last one, typically)
    first_skipped: str = ""
    merge_s: float | None = None  # the header's: windows were merged to this length (late in the run)

    @property
    def note(self) -> str | None:
        """What a reader of the recording should be told about damaged lines skipped; None when none were."""
        if not self.skipped:
            return None
        return (
            f"skipped {self.skipped} damaged line(s) of {self.lines} (first at {self.first_skipped}); "
            "a recorder killed mid-write leaves one"
        )

    @property
    def lost_after_s(self) -> float:
        """Silence that means a rank is lost, in this recording: longer where windows were merged."""
        return max(LOST_AFTER_S, 2 * self.merge_s) if self.merge_s else LOST_AFTER_S


def read(path: Path, stats: ReadStats | None = None) -> Iterator[Entry]:
    """Yield a recording's entries in file order; raise RecordingError if it is not one."""
    stats = stats if stats is not None else ReadStats()
    try:
        handle = _open_text(path)
    except OSError as exc:
        raise RecordingError(f"cannot read {path}: {exc.strerror}") from None
    with handle:
        try:
            header = handle.readline()
        except (EOFError, zlib.error, gzip.BadGzipFile):
            header = ""
        try:
            head = json.loads(header)
        except ValueError:
            head = None
        if not isinstance(head, dict) or head.get("type") != "recording":
            raise RecordingError(f"{path} is not a gputop recording (make one with `gputop record`)")
        if isinstance(head.get("merge_s"), (int, float)):
            stats.merge_s = float(head["merge_s"])
        for number, line in enumerate(_lines_until_cut(handle), start=2):
            stats.lines += 1
            entry = _decode_line(line)
            if entry is None:
                stats.skipped += 1
                stats.first_skipped = stats.first_skipped or f"line {number}"
                continue
            yield entry


def _open_text(path: Path) -> IO[str]:
    """A recording as text, gzip or not (told by its magic bytes, not its name)."""
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.GzipFile(path, "rb"), encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def _lines_until_cut(handle: IO[str]) -> Iterator[str]:
    """Every line, stopping quietly where a killed recorder's gzip stream ends early."""
    while True:
        try:
            line = handle.readline()
        except (EOFError, zlib.error, gzip.BadGzipFile):
            return
        if not line:
            return
        yield line


def _decode_line(line: str) -> Entry | None:
    try:
        obj = json.loads(line)
        kind = obj.get("type")
        if kind in ("gpu", "node_gpu"):  # node_gpu: another host's GPUs, from its node sampler
            sample = gpu_sample_from_dict(obj)
            if kind == "node_gpu" and not sample.hostname:
                return None
            return Entry(sample.t, kind, sample)
        if kind == "host":
            host = host_sample_from_dict(obj)
            return Entry(host.t, "host", host)
        if kind == "disconnect":
            fields = (str(obj["run_id"]), int(obj["rank"]), str(obj["reason"]), int(obj.get("pid", 0)))
            return Entry(float(obj["t"]), "disconnect", fields)
        recv_t = float(obj.pop("recv_t"))
        return Entry(recv_t, "message", from_dict(obj))
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError, ProtocolError):
        return None


def apply(store: Store, entry: Entry) -> None:
    """Feed one entry into a store, as the live collector and samplers would."""
    if entry.kind == "message":
        store.ingest(entry.value, entry.t)
    elif entry.kind == "gpu":
        store.add_gpu(entry.value)
    elif entry.kind == "node_gpu":
        store.add_node_gpu(entry.value)
    elif entry.kind == "host":
        store.add_host(entry.value)
    elif entry.kind == "disconnect":
        store.disconnected(*entry.value)


def refreshes(path: Path, every_s: float, *, past_end_s: float = 0.0) -> Iterator[tuple[float, Store]]:
    """The recording as a live view reads it: fed into one store at its own pace, and handed over every
    ``every_s`` of its time, with that time, until ``past_end_s`` after its last entry (a view goes on
    refreshing after a run has ended).  The same store each time, filled further: read it before the next."""
    stats = ReadStats()
    entries = sorted(read(path, stats), key=lambda e: e.t)
    if not entries:
        return
    store = Store(lost_after_s=stats.lost_after_s)
    t, i = entries[0].t, 0
    while t < entries[-1].t + past_end_s:
        t += every_s
        while i < len(entries) and entries[i].t <= t:
            apply(store, entries[i])
            i += 1
        yield t, store


def load(path: Path, stats: ReadStats | None = None) -> tuple[Store, float]:
    """A store holding the whole recording, and the time of its last entry."""
    stats = stats if stats is not None else ReadStats()
    store = Store(history_windows=None, history_samples=None)
    store.listen = f"recording {path}"
    last_t = 0.0
    for entry in read(path, stats):
        store.lost_after_s = stats.lost_after_s  # known once the header is read
        apply(store, entry)
        last_t = max(last_t, entry.t)
    return store, last_t
