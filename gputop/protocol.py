"""The wire format between reporters and the collector.

Newline-delimited JSON, one message per line, every message a JSON object with
``v`` (protocol version), ``type`` (hello, window, event, bye), ``run_id`` and
``rank``.  Encoding and decoding are pure functions; nothing here does I/O.
Absent optional fields mean "not measured" (N/A), never zero.  No pickle, no
eval: a frame is only ever parsed as JSON and checked field by field.

The full description, with examples, is in docs/protocol.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Union

PROTOCOL_VERSION = 1

# A window is ~1 KiB and a hello ~1.5 KiB; 64 KiB leaves room for growth while
# keeping a misbehaving peer from making the collector buffer megabytes.
MAX_FRAME_BYTES = 64 * 1024

# Step-time histogram: log-spaced buckets, 4 per octave from 100 us.  Mergeable
# across windows and ranks, so run-level percentiles need no per-step data.
HIST_BASE_S = 1e-4
HIST_BUCKETS_PER_OCTAVE = 4
HIST_MAX_BUCKET = 100  # 100 us * 2**25 ~ 56 min: longer steps land in the last bucket


# Integers beyond what a double holds exactly are nobody's step count or pid.
MAX_INT = 2**53
MAX_STRING_CHARS = 4096


class ProtocolError(ValueError):
    """A frame that is not a valid message of this protocol version."""


def hist_bucket(seconds: float) -> int:
    """The histogram bucket a step duration falls into."""
    if seconds <= HIST_BASE_S:
        return 0
    index = int(math.log2(seconds / HIST_BASE_S) * HIST_BUCKETS_PER_OCTAVE) + 1
    return min(index, HIST_MAX_BUCKET)


def hist_bucket_mid_s(index: int) -> float:
    """A representative duration for a bucket (its geometric middle)."""
    index = min(max(index, 0), HIST_MAX_BUCKET)
    if index == 0:
        return HIST_BASE_S
    return float(HIST_BASE_S * 2 ** ((index - 0.5) / HIST_BUCKETS_PER_OCTAVE))


def hist_quantile_s(hist: dict[int, int], q: float) -> float | None:
    """The q-quantile (0..1) of a merged step-time histogram, or None if empty."""
    total = sum(hist.values())
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for index in sorted(hist):
        seen += hist[index]
        if seen >= rank:
            return hist_bucket_mid_s(index)
    return hist_bucket_mid_s(max(hist))


@dataclass(frozen=True)
class Hello:
    """Static facts about one rank, sent first on every connection.

    Sent again on the same connection when a fact becomes known later (for
    example the DataLoader config once ``track()`` is called); the collector
    keeps the latest.
    """

    TYPE: ClassVar[str] = "hello"

    run_id: str
    rank: int
    world_size: int = 1
    local_rank: int = 0
    hostname: str = ""
    pid: int = 0
    name: str = ""  # the script, for humans
    started_t: float = 0.0  # unix time the reporter started
    window_s: float = 0.5
    gputop_version: str = ""
    torch_version: str | None = None
    backend: str | None = None  # "nccl", "gloo", None when not distributed
    device: str | None = None  # "cuda:0", "cpu"
    device_name: str | None = None
    device_uuid: str | None = None  # "GPU-…" from torch, the key for the NVML join
    device_total_bytes: int | None = None
    loader_batch_size: int | None = None
    loader_num_workers: int | None = None
    loader_pin_memory: bool | None = None
    loader_persistent_workers: bool | None = None
    loader_prefetch_factor: int | None = None
    autocast: bool | None = None  # seen enabled during forward of the watched model
    param_dtype: str | None = None  # dtype of most parameters, "float32", "bfloat16", …
    tf32_matmul: bool | None = None
    tf32_cudnn: bool | None = None
    cudnn_benchmark: bool | None = None
    torch_threads: int | None = None
    cpu_count: int | None = None  # CPUs this process may run on
    model_name: str | None = None
    ddp: bool | None = None


@dataclass(frozen=True)
class Window:
    """What one rank did during one reporting window (default 0.5 s).

    Times are seconds, memory is bytes.  ``loader_wait_s`` and
    ``step_time_sum_s`` are totals over the steps that ended in the window, so
    their ratio is the loader-wait share.  The DDP figures (``forward_s`` …
    ``overlap_s``) are per step: the mean over ``ddp_steps`` iterations, or,
    when that is None, DDP's latest sampled iteration.
    """

    TYPE: ClassVar[str] = "window"

    run_id: str
    rank: int
    seq: int
    t0: float  # unix time, start of the window
    t1: float  # unix time, end of the window
    steps: int = 0  # optimizer steps that ended in the window
    step_total: int = 0  # steps since the reporter started, this one included
    # Steps with a known duration: a reporter's first step has none.  The time
    # totals (step_time_sum_s, loader_wait_s) cover these; None means all steps.
    timed_steps: int | None = None
    step_time_sum_s: float = 0.0
    step_time_p50_s: float | None = None
    step_time_p95_s: float | None = None
    step_time_max_s: float | None = None
    step_hist: dict[int, int] = field(default_factory=dict)
    gpu_step_time_p50_s: float | None = None  # CUDA events between step marks
    loader_wait_s: float = 0.0
    loader_batches: int = 0
    samples: int | None = None  # steps × batch size, when the batch size is known
    forward_s: float | None = None
    backward_s: float | None = None  # backward compute
    comm_s: float | None = None  # gradient all-reduce, start to end
    overlap_s: float | None = None  # part of comm hidden behind backward compute
    ddp_iteration: int | None = None  # DDP's iteration the figures come from (the last one)
    ddp_steps: int | None = None  # iterations the DDP figures average; None: one sampled iteration
    mem_allocated_bytes: int | None = None
    mem_reserved_bytes: int | None = None
    mem_peak_bytes: int | None = None
    mem_total_bytes: int | None = None
    alloc_retries: int | None = None
    ooms: int | None = None
    cpu_pct: float | None = None  # the rank process, 100 = one core
    rss_bytes: int | None = None
    threads: int | None = None
    workers: int | None = None  # live DataLoader worker processes
    workers_cpu_pct: float | None = None
    dropped: int = 0  # windows this reporter had to drop so far

    @property
    def duration_s(self) -> float:
        return max(self.t1 - self.t0, 1e-9)

    @property
    def timed(self) -> int:
        """How many steps the time totals cover."""
        return self.steps if self.timed_steps is None else self.timed_steps

    @property
    def step_time_mean_s(self) -> float | None:
        return self.step_time_sum_s / self.timed if self.timed > 0 else None

    @property
    def exposed_comm_s(self) -> float | None:
        """Communication not hidden behind backward compute, per step."""
        if self.comm_s is None:
            return None
        return max(self.comm_s - (self.overlap_s or 0.0), 0.0)


@dataclass(frozen=True)
class Event:
    """Something that happened once: an OOM, a reporter-internal error, a note."""

    TYPE: ClassVar[str] = "event"

    run_id: str
    rank: int
    t: float
    kind: str
    message: str = ""


@dataclass(frozen=True)
class Bye:
    """A rank's reporter shutting down cleanly (the process is exiting)."""

    TYPE: ClassVar[str] = "bye"

    run_id: str
    rank: int
    t: float
    step_total: int = 0
    dropped: int = 0


Message = Union[Hello, Window, Event, Bye]  # noqa: UP007 - a runtime alias, Python 3.10 too
MESSAGE_TYPES: dict[str, type[Message]] = {cls.TYPE: cls for cls in (Hello, Window, Event, Bye)}  # type: ignore[misc]

_FIELDS: dict[type, dict[str, Any]] = {cls: {f.name: f for f in fields(cls)} for cls in MESSAGE_TYPES.values()}


def to_dict(message: Message) -> dict[str, Any]:
    """The JSON object for a message; None fields are left out (N/A)."""
    out: dict[str, Any] = {"v": PROTOCOL_VERSION, "type": message.TYPE}
    for name in _FIELDS[type(message)]:
        value = getattr(message, name)
        if value is None or (name == "step_hist" and not value):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        if name == "step_hist":
            value = {str(k): v for k, v in value.items()}
        out[name] = value
    return out


def encode(message: Message) -> bytes:
    """One frame: compact JSON and a newline."""
    return json.dumps(to_dict(message), separators=(",", ":"), allow_nan=False).encode() + b"\n"


def decode(frame: bytes | str) -> Message:
    """Parse one frame; raise ProtocolError saying what is wrong with it."""
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    try:
        obj = json.loads(frame)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    return from_dict(obj)


def from_dict(obj: Any) -> Message:
    """Build a message from a decoded JSON object, checking every field's type."""
    if not isinstance(obj, dict):
        raise ProtocolError("a frame must be a JSON object")
    version = obj.get("v")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version!r}, expected {PROTOCOL_VERSION}")
    cls = MESSAGE_TYPES.get(obj.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise ProtocolError(f"unknown message type {obj.get('type')!r}")
    kwargs: dict[str, Any] = {}
    for name, spec in _FIELDS[cls].items():
        if name not in obj:
            continue
        kwargs[name] = _check(cls.TYPE, name, spec.type, obj[name])
    try:
        message = cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise ProtocolError(f"{cls.TYPE}: {exc}") from None
    _check_sense(message)
    return message


def _check_sense(message: Message) -> None:
    """Values no reporter produces: negative counts or ranks, windows that end before they start."""
    if message.rank < 0:
        raise ProtocolError(f"{message.TYPE}.rank must not be negative")
    if isinstance(message, Hello) and message.world_size < 1:
        raise ProtocolError("hello.world_size must be at least 1")
    if isinstance(message, Window):
        if (
            min(message.seq, message.steps, message.step_total, message.loader_batches, message.dropped, message.timed)
            < 0
        ):
            raise ProtocolError("window counts must not be negative")
        if message.ddp_steps is not None and message.ddp_steps < 1:
            raise ProtocolError("window.ddp_steps must be at least 1")
        if message.t1 < message.t0 or message.step_time_sum_s < 0 or message.loader_wait_s < 0:
            raise ProtocolError("window times must not run backwards")


def _check(type_name: str, name: str, annotation: str, value: Any) -> Any:
    """Validate one field against its annotation (a string, thanks to __future__)."""
    optional = "None" in annotation
    if value is None:
        if optional:
            return None
        raise ProtocolError(f"{type_name}.{name} must not be null")
    base = annotation.replace(" | None", "")
    if base == "str":
        ok = isinstance(value, str) and len(value) <= MAX_STRING_CHARS
    elif base == "bool":
        ok = isinstance(value, bool)
    elif base == "int":
        ok = isinstance(value, int) and not isinstance(value, bool) and -MAX_INT < value < MAX_INT
    elif base == "float":
        try:  # an integer like 10**400 is valid JSON but no float
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            value = float(value) if ok else value
        except OverflowError:
            ok = False
    elif base == "dict[int, int]":
        ok = isinstance(value, dict) and len(value) <= HIST_MAX_BUCKET + 1
        if ok:
            try:
                value = {int(k): int(v) for k, v in value.items() if int(v) > 0}
                ok = all(0 <= k <= HIST_MAX_BUCKET and v < MAX_INT for k, v in value.items())
            except (TypeError, ValueError, OverflowError):
                ok = False
    else:  # pragma: no cover - a field type this function does not know is a bug here
        raise AssertionError(f"unhandled field type {annotation}")
    if not ok:
        raise ProtocolError(f"{type_name}.{name} must be {base}, got {type(value).__name__}")
    return value
