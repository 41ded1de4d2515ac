"""Recordings: every message received plus GPU and host samples, one JSON object per line.

The first line is a header (``{"type": "recording", ...}``).  Reporter messages
are stored as their protocol objects with ``recv_t`` added; samples as
``{"type": "gpu"|"host", ...}``; a rank's connection ending as
``{"type": "disconnect", ...}``.  Each line is flushed as it is written, so a
recorder killed at any moment leaves a file whose complete lines all read back.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gputop import __version__
from gputop.collect.store import Store
from gputop.model.samples import (
    GpuSample,
    HostSample,
    gpu_sample_from_dict,
    host_sample_from_dict,
    sample_to_dict,
)
from gputop.protocol import Message, ProtocolError, from_dict, to_dict

RECORDING_VERSION = 1


class RecordingError(Exception):
    """A file that is not a gputop recording; the message is one line for the user."""


class Recorder:
    """Appends to a recording; safe to call from the collector and sampler threads."""

    def __init__(self, path: Path, *, source: str) -> None:
        try:
            self._file: IO[str] = open(path, "w", encoding="utf-8", buffering=1)  # noqa: SIM115
        except OSError as exc:
            raise RecordingError(f"cannot write {path}: {exc.strerror}") from None
        self._lock = threading.Lock()
        self.lines = 0
        self._write(
            {
                "type": "recording",
                "version": RECORDING_VERSION,
                "gputop_version": __version__,
                "started_t": time.time(),
                "source": source,
            }
        )

    def message(self, message: Message, recv_t: float) -> None:
        self._write({**to_dict(message), "recv_t": recv_t})

    def sample(self, sample: GpuSample | HostSample) -> None:
        self._write(sample_to_dict(sample))

    def disconnect(self, run_id: str, rank: int, reason: str, t: float, pid: int = 0) -> None:
        self._write({"type": "disconnect", "run_id": run_id, "rank": rank, "reason": reason, "t": t, "pid": pid})

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def _write(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, separators=(",", ":")) + "\n"
        with self._lock:
            if not self._file.closed:
                self._file.write(line)
                self.lines += 1


@dataclass(frozen=True)
class Entry:
    """One line of a recording, decoded."""

    t: float  # when it was received or sampled
    kind: str  # "message", "gpu", "host", "disconnect"
    value: Any  # a protocol Message, GpuSample, HostSample, or (run_id, rank, reason, pid)


@dataclass
class ReadStats:
    lines: int = 0
    skipped: int = 0  # damaged lines (a killed recorder's last one, typically)
    first_skipped: str = ""


def read(path: Path, stats: ReadStats | None = None) -> Iterator[Entry]:
    """Yield a recording's entries in file order; raise RecordingError if it is not one."""
    stats = stats if stats is not None else ReadStats()
    try:
        handle = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115
    except OSError as exc:
        raise RecordingError(f"cannot read {path}: {exc.strerror}") from None
    with handle:
        header = handle.readline()
        try:
            head = json.loads(header)
        except ValueError:
            head = None
        if not isinstance(head, dict) or head.get("type") != "recording":
            raise RecordingError(f"{path} is not a gputop recording (make one with `gputop record`)")
        for number, line in enumerate(handle, start=2):
            stats.lines += 1
            entry = _decode_line(line)
            if entry is None:
                stats.skipped += 1
                stats.first_skipped = stats.first_skipped or f"line {number}"
                continue
            yield entry


def _decode_line(line: str) -> Entry | None:
    try:
        obj = json.loads(line)
        kind = obj.get("type")
        if kind == "gpu":
            sample = gpu_sample_from_dict(obj)
            return Entry(sample.t, "gpu", sample)
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
    elif entry.kind == "host":
        store.add_host(entry.value)
    elif entry.kind == "disconnect":
        store.disconnected(*entry.value)


def load(path: Path, stats: ReadStats | None = None) -> tuple[Store, float]:
    """A store holding the whole recording, and the time of its last entry."""
    store = Store(history_windows=None, history_samples=None)
    store.listen = f"recording {path}"
    last_t = 0.0
    for entry in read(path, stats):
        apply(store, entry)
        last_t = max(last_t, entry.t)
    return store, last_t
