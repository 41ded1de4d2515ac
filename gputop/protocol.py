"""The wire format between reporters and the collector.

Newline-delimited JSON, one message per line, every message a JSON object with
``v`` (protocol version), ``type`` (hello, window, event, bye, ...), ``run_id`` and
``rank``.  The messages are ``msgspec.Struct``s whose annotations carry the
limits (string lengths, integer ranges, histogram buckets), so one typed
decode both parses and checks a frame; ``__post_init__`` adds the checks that
relate fields (a window that ends before it starts).  Encoding and decoding are
pure functions; nothing here does I/O.  Absent optional fields mean "not
measured" (N/A), never zero; defaults are left off the wire.  No pickle, no
eval: a frame is only ever parsed as JSON into these types.

The full description, with examples, is in docs/protocol.md.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Final, Literal, Union

import msgspec
from msgspec import Meta

from gputop.sketch import HIST_MAX_BUCKET, SKETCH_MAX_BUCKET

PROTOCOL_VERSION: Final = 1

# A window is ~1 KiB and a hello ~1.5 KiB; 64 KiB leaves room for growth while
# keeping a misbehaving peer from making the collector buffer megabytes.
MAX_FRAME_BYTES = 64 * 1024

# The slowest steps each window names with their loader wait: a stall (a
# checkpoint save, an evaluation pass, a slow batch) is a few steps among many,
# and three per half-second window keep every stall that is occasional.
SLOW_STEPS_KEPT = 3

# Integers beyond what a double holds exactly are nobody's step count or pid.
MAX_INT = 2**53
MAX_STRING_CHARS = 4096


class ProtocolError(ValueError):
    """A frame that is not a valid message of this protocol version."""


# The limits as types: msgspec checks them while it decodes.
Text = Annotated[str, Meta(max_length=MAX_STRING_CHARS)]
Count = Annotated[int, Meta(ge=0, lt=MAX_INT)]  # no reporter sends a negative count, rank, size or pid
AtLeastOne = Annotated[int, Meta(ge=1, lt=MAX_INT)]
Seconds = Annotated[float, Meta(ge=0.0)]  # a duration or a total of durations
Bucket = Annotated[int, Meta(ge=0, le=SKETCH_MAX_BUCKET)]
LegacyBucket = Annotated[int, Meta(ge=0, le=HIST_MAX_BUCKET)]
# A tuple, not a list: an empty list per window is an object the garbage collector walks.
SlowSteps = Annotated[tuple[tuple[Seconds, Seconds], ...], Meta(max_length=SLOW_STEPS_KEPT)]
SlowStepNumbers = Annotated[tuple[Count, ...], Meta(max_length=SLOW_STEPS_KEPT)]


# The name of a message type, in a hello's ``sends`` and a collector's ``accepts``.
TypeName = Annotated[str, Meta(max_length=32)]


class _Message(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True, tag_field="type"):
    """What every message shares.  ``v`` is written first by ``encode``; absent, it reads as this version."""

    TYPE: ClassVar[str]


class Hello(_Message, frozen=True, kw_only=True, tag="hello"):
    """Static facts about one rank, sent first on every connection.

    Sent again on the same connection when a fact becomes known later (for
    example the DataLoader config once ``track()`` is called); the collector
    keeps the latest.
    """

    TYPE: ClassVar[str] = "hello"

    v: Literal[1] = PROTOCOL_VERSION

    run_id: Text
    rank: Count
    world_size: AtLeastOne = 1
    local_rank: Count = 0
    hostname: Text = ""
    pid: Count = 0
    name: Text = ""  # the script, for humans
    started_t: float = 0.0  # unix time the reporter started
    window_s: float = 0.5
    gputop_version: Text = ""
    torch_version: Text | None = None
    backend: Text | None = None  # "nccl", "gloo", None when not distributed
    device: Text | None = None  # "cuda:0", "cpu"
    device_name: Text | None = None
    device_uuid: Text | None = None  # "GPU-…" from torch, the key for the NVML join
    device_total_bytes: Count | None = None
    # nn.DataParallel: one rank computing on several GPUs, device_uuid's first.  None for one device.
    device_uuids: tuple[Text, ...] | None = None
    data_parallel: bool | None = None
    loader_batch_size: Count | None = None
    loader_num_workers: Count | None = None
    loader_pin_memory: bool | None = None
    loader_persistent_workers: bool | None = None
    loader_prefetch_factor: Count | None = None
    autocast: bool | None = None  # seen enabled during forward of the watched model
    param_dtype: Text | None = None  # dtype of most parameters, "float32", "bfloat16", …
    tf32_matmul: bool | None = None
    tf32_cudnn: bool | None = None
    cudnn_benchmark: bool | None = None
    torch_threads: Count | None = None
    cpu_count: Count | None = None  # CPUs this process may run on
    model_name: Text | None = None
    ddp: bool | None = None
    # How DDP was built, from its logging data once it has run an iteration:
    ddp_find_unused_parameters: bool | None = None
    ddp_unused_parameter_bytes: Count | None = None  # what find_unused_parameters found unused
    ddp_static_graph: bool | None = None
    ddp_gradient_as_bucket_view: bool | None = None
    ddp_bucket_cap_bytes: Count | None = None
    ddp_buckets: Count | None = None  # gradient buckets each backward all-reduces
    ddp_gradient_bytes: Count | None = None  # all parameters' size: what one all-reduce round moves
    # The scheduler's names for the job (docs/protocol.md#job-ids): None when not under it.
    slurm_job_id: Text | None = None
    slurm_step_id: Text | None = None
    slurm_nodelist: Text | None = None
    k8s_pod: Text | None = None
    k8s_namespace: Text | None = None
    elastic_run_id: Text | None = None  # torchrun's TORCHELASTIC_RUN_ID (rendezvous id)
    # Optional message types this reporter can send (``OPTIONAL_TYPES``), once the collector accepts them.
    sends: Annotated[tuple[TypeName, ...], Meta(max_length=16)] = ()


# gc=False: a window holds numbers, strings and flat dicts of numbers, never a cycle, so
# the garbage collector need not walk it.  A dashboard keeps 150,000 of them, and
# walking them stalled every thread for 0.3-0.8 s (a keypress waited that long).
class Window(_Message, frozen=True, kw_only=True, tag="window", gc=False):
    """What one rank did during one reporting window (default 0.5 s).

    Times are seconds, memory is bytes.  ``loader_wait_s`` and
    ``step_time_sum_s`` are totals over the steps that ended in the window, so
    their ratio is the loader-wait share.  The DDP figures (``forward_s`` …
    ``overlap_s``) are per step: the mean over ``ddp_steps`` iterations, or,
    when that is None, DDP's latest sampled iteration.
    """

    TYPE: ClassVar[str] = "window"

    v: Literal[1] = PROTOCOL_VERSION

    run_id: Text
    rank: Count
    seq: Count
    t0: float  # unix time, start of the window
    t1: float  # unix time, end of the window
    steps: Count = 0  # optimizer steps that ended in the window
    step_total: Count = 0  # steps since the reporter started, this one included
    # Steps with a known duration: a reporter's first step has none.  The time
    # totals (step_time_sum_s, loader_wait_s) cover these; None means all steps.
    timed_steps: Count | None = None
    step_time_sum_s: Seconds = 0.0
    step_time_p50_s: float | None = None
    step_time_p95_s: float | None = None
    step_time_max_s: float | None = None
    step_sketch: dict[Bucket, Count] = {}  # {bucket: steps}, see sketch_bucket
    slow_steps: SlowSteps = ()  # the window's slowest steps: (duration, loader wait), slowest first
    # Their step numbers (the reporter's count, as step_total), in the same order; () from older reporters.
    slow_step_numbers: SlowStepNumbers = ()
    step_hist: dict[LegacyBucket, Count] = {}  # recordings of the first protocol only; new reporters send step_sketch
    gpu_step_time_p50_s: float | None = None  # CUDA events between step marks
    loader_wait_s: Seconds = 0.0
    loader_batches: Count = 0
    samples: Count | None = None  # steps × batch size, when the batch size is known
    forward_s: float | None = None
    backward_s: float | None = None  # backward compute
    comm_s: float | None = None  # gradient all-reduce, start to end
    overlap_s: float | None = None  # part of comm hidden behind backward compute
    forwards: Count | None = None  # forwards of the watched model with autograd on: micro-batches
    ddp_iteration: Count | None = None  # DDP's iteration the figures come from (the last one)
    ddp_steps: AtLeastOne | None = None  # iterations the DDP figures average; None: one sampled iteration
    mem_allocated_bytes: Count | None = None
    mem_reserved_bytes: Count | None = None
    mem_peak_bytes: Count | None = None
    mem_total_bytes: Count | None = None
    alloc_retries: Count | None = None
    ooms: Count | None = None
    cpu_pct: float | None = None  # the rank process, 100 = one core
    rss_bytes: Count | None = None
    threads: Count | None = None
    workers: Count | None = None  # live DataLoader worker processes
    workers_cpu_pct: float | None = None
    # Run-queue wait in the window (ready to run, no CPU free), from /proc/<pid>/task/<tid>/schedstat:
    main_cpu_wait_s: Seconds | None = None  # the training thread
    cpu_wait_s: Seconds | None = None  # the rank's compute threads together (gloo's and NCCL's own left out)
    cpu_run_s: Seconds | None = None  # the CPU time of those same threads
    workers_cpu_wait_s: Seconds | None = None  # all the DataLoader workers' threads together
    dropped: Count = 0  # windows this reporter had to drop so far
    # What gputop itself cost the rank in this window (self-accounting):
    reporter_cpu_s: float | None = None  # CPU time of the reporter thread
    hook_s: float | None = None  # training-thread time in gputop's step marks and loader bookkeeping (calibrated)
    sent_bytes: Count | None = None  # bytes written to the dashboard's socket

    def __post_init__(self) -> None:
        # The one check no annotation can say: the counts, sizes and durations are typed non-negative.
        if self.t1 < self.t0:
            raise ValueError("window times must not run backwards")

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


class Event(_Message, frozen=True, kw_only=True, tag="event"):
    """Something that happened once: an OOM, a reporter-internal error, a note."""

    TYPE: ClassVar[str] = "event"

    v: Literal[1] = PROTOCOL_VERSION

    run_id: Text
    rank: Count
    t: float
    kind: Text
    message: Text = ""


class Bye(_Message, frozen=True, kw_only=True, tag="bye"):
    """A rank's reporter shutting down cleanly (the process is exiting)."""

    TYPE: ClassVar[str] = "bye"

    v: Literal[1] = PROTOCOL_VERSION

    run_id: Text
    rank: Count
    t: float
    step_total: Count = 0
    dropped: Count = 0


MAX_CAPTURE_STEPS = 1000
TOP_OPS = 10  # operators a capture result lists, by self time


class OpTime(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """One operator of a profiler capture: how often it ran and its own time (children excluded)."""

    name: Text
    calls: Count = 0
    self_cpu_s: Seconds = 0.0
    self_device_s: Seconds | None = None  # None: no CUDA activity was profiled


class CaptureResult(_Message, frozen=True, kw_only=True, tag="capture_result"):
    """A rank's answer to a capture request: where its trace is and its busiest operators, or why it failed."""

    TYPE: ClassVar[str] = "capture_result"

    v: Literal[1] = PROTOCOL_VERSION

    run_id: Text
    rank: Count
    id: Annotated[str, Meta(max_length=64)]
    t: float
    ok: bool
    steps: Count = 0  # steps the trace covers
    wall_s: Seconds = 0.0  # from the first captured step's start to the last one's end
    trace_path: Text = ""  # the Chrome/Perfetto JSON trace, on the rank's host
    top_ops: Annotated[
        tuple[OpTime, ...], Meta(max_length=2 * TOP_OPS)
    ] = ()  # by self CPU time, then by self device time
    error: Text = ""  # why it failed; training went on untouched


# -- where the training thread is: optional, sent only to a collector that accepts it --------------

STACKS_TOP = 5  # the places a reporter names per stacks message
MAX_STACKS_TOP = 20  # the wire's limit: merged recordings keep more
Where = Annotated[str, Meta(max_length=32)]  # a string, not a closed set: a newer reporter may name more
FrameText = Annotated[str, Meta(max_length=256)]


class StackFrame(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One place the training thread was: what it was inside, and its innermost frame in the user's own code.

    On the wire an array, ``["after_step", "train.py", 57, "compute_metrics"]``.
    ``where`` is one of ``loader``, ``forward``, ``backward``, ``optimizer``,
    ``collective``, ``after_step``, ``before_step``, ``outside``; ``file`` is ""
    when no frame of the user's code was on the stack.
    """

    where: Where
    file: FrameText
    line: Count
    function: FrameText


class SampledFrame(StackFrame, frozen=True, array_like=True, gc=False):
    """A place and how many samples found the training thread there."""

    count: Count


class Collective(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """The collective a rank entered last, from torch's Flight Recorder.

    On the wire an array, ``["gloo:all_reduce", 41, "scheduled", "default_pg"]``.
    """

    name: Annotated[str, Meta(max_length=64)]  # torch's profiling name: backend:collective
    seq: Count  # the process group's collective sequence number: equal across the ranks that joined it
    state: Annotated[str, Meta(max_length=16)]  # scheduled, started, completed (NCCL tracks the last two)
    group: Annotated[str, Meta(max_length=64)] = ""  # the process group's name ("default_pg")


class Stacks(_Message, frozen=True, kw_only=True, tag="stacks", gc=False):
    """Where one rank's training thread was, sampled from its reporter thread since the last stacks message.

    ``top`` are the places most samples found, most first; ``now`` is the
    newest sample's (what a hang needs).  Sent about once a second, only to a
    collector whose ``accepts`` command named ``stacks``.
    """

    TYPE: ClassVar[str] = "stacks"

    v: Literal[1] = PROTOCOL_VERSION

    run_id: Text
    rank: Count
    t: float  # unix time of the newest sample
    period_s: Seconds = 0.0  # how long the samples cover: since the last stacks message
    interval_s: Seconds = 0.0  # the sampling interval in use (the rate falls when a sample costs more)
    samples: Count = 0
    top: Annotated[tuple[SampledFrame, ...], Meta(max_length=MAX_STACKS_TOP)] = ()
    now: StackFrame | None = None
    # While no step has finished for a few seconds and the user turned torch's Flight Recorder on: the last
    # collective the rank entered (None otherwise, and from reporters that do not read it).
    collective: Collective | None = None

    def __post_init__(self) -> None:
        if sum(frame.count for frame in self.top) > self.samples:
            raise ValueError("stacks: the top places count more samples than were taken")


# The optional upstream types: a reporter sends one only on a connection whose collector accepted it.
OPTIONAL_TYPES: tuple[str, ...] = ("stacks",)


Message = Union[Hello, Window, Event, Bye, CaptureResult, Stacks]  # noqa: UP007 - a runtime alias, Python 3.10 too
MESSAGE_TYPES: tuple[type[Message], ...] = (Hello, Window, Event, Bye, CaptureResult, Stacks)


class Gpus(_Message, frozen=True, kw_only=True, tag="gpus"):
    """One host's NVML readings, from its node sampler (``python -m gputop.node``), once a second.

    Speaks for a host, not a rank: no run id, no hello before it.  ``sample``
    is a ``GpuSample`` (``gputop.model.samples``) as recordings write it; the
    collector checks it field by field on arrival (``gpu_sample_from_wire``),
    and a sample that does not check closes the connection like any bad frame.
    """

    TYPE: ClassVar[str] = "gpus"

    v: Literal[1] = PROTOCOL_VERSION

    hostname: Annotated[str, Meta(min_length=1, max_length=255)]
    t: float  # the node's clock; the collector stamps its own receive time on the sample it keeps
    sample: dict[str, Any]


# What a connection may send upstream: a rank's messages, or a node sampler's readings.
Upstream = Union[Hello, Window, Event, Bye, CaptureResult, Stacks, Gpus]  # noqa: UP007 - a runtime alias


# -- commands: the only frames that travel from the dashboard to a reporter ------------------------


class CaptureRequest(_Message, frozen=True, kw_only=True, tag="capture"):
    """Run torch.profiler on one rank for its next ``steps`` steps.

    The one command there is: a fixed request with bounded fields, never code.
    ``gputop capture`` sends it to the collector, which relays it to the rank's
    own connection; ``run_id`` "" means the newest run that has this rank.
    """

    TYPE: ClassVar[str] = "capture"

    v: Literal[1] = PROTOCOL_VERSION

    run_id: Text = ""
    rank: Count
    id: Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    steps: Annotated[int, Meta(ge=1, le=MAX_CAPTURE_STEPS)] = 5
    timeout_s: Annotated[float, Meta(gt=0, le=3600)] = 120.0  # how long the asker waits for the result


class FindingBrief(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True):
    """A finding as a rank needs it for its trainer's logger: what, how bad, about whom."""

    cause: Annotated[str, Meta(max_length=32)]
    severity: Literal["info", "warn", "critical"]
    title: Annotated[str, Meta(max_length=300)]
    ranks: Annotated[tuple[Count, ...], Meta(max_length=64)] = ()


MAX_FINDINGS_NOTICED = 20


class FindingsNotice(_Message, frozen=True, kw_only=True, tag="findings"):
    """The findings the dashboard shows for the rank's run now (empty: none), so the rank can log them.

    Sent by a dashboard (or ``record --on-finding``) when its findings for the
    run change.  Data only: a reporter stores it and logs it, nothing more.
    """

    TYPE: ClassVar[str] = "findings"

    v: Literal[1] = PROTOCOL_VERSION

    run_id: Text
    rank: Count
    t: float
    findings: Annotated[tuple[FindingBrief, ...], Meta(max_length=MAX_FINDINGS_NOTICED)] = ()


class Accepts(_Message, frozen=True, kw_only=True, tag="accepts"):
    """The optional upstream types (of those the rank's hello ``sends``) this collector reads on this connection.

    A collector from before a type never says it accepts it, so a reporter
    never sends it a frame that would close the connection; and a reporter
    from before ``sends`` is never sent this command, which it would not know.
    """

    TYPE: ClassVar[str] = "accepts"

    v: Literal[1] = PROTOCOL_VERSION

    run_id: Text
    rank: Count
    types: Annotated[tuple[TypeName, ...], Meta(max_length=16)] = ()


Command = Union[CaptureRequest, FindingsNotice, Accepts]  # noqa: UP007 - a runtime alias


class _Head(msgspec.Struct):
    """Just the version: a frame of another version is named as such, whatever its fields."""

    v: Any = PROTOCOL_VERSION


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Message)
_upstream_decoder = msgspec.json.Decoder(Upstream)
_command_decoder = msgspec.json.Decoder(Command)
_head_decoder = msgspec.json.Decoder(_Head)
_VERSION_PREFIX = b'{"v":%d,' % PROTOCOL_VERSION


def to_dict(message: Message) -> dict[str, Any]:
    """The JSON object for a message; None fields and defaults are left out (N/A)."""
    return {"v": PROTOCOL_VERSION, **msgspec.to_builtins(message)}


def encode(message: Message | Gpus | Command) -> bytes:
    """One frame: compact JSON, ``v`` first, and a newline."""
    return _VERSION_PREFIX + _encoder.encode(message)[1:] + b"\n"


def decode(frame: bytes | str) -> Message:
    """Parse and check one frame; raise ProtocolError saying what is wrong with it."""
    return _decode_with(_decoder, frame)  # type: ignore[no-any-return]


def decode_upstream(frame: bytes | str) -> Upstream:
    """Parse and check one frame a connection sent the collector: a rank's message or a host's GPUs."""
    return _decode_with(_upstream_decoder, frame)  # type: ignore[no-any-return]


def _decode_with(decoder: msgspec.json.Decoder[Any], frame: bytes | str) -> Any:
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    try:
        return decoder.decode(frame)
    except msgspec.ValidationError as exc:
        try:
            version = _head_decoder.decode(frame).v
        except msgspec.MsgspecError:
            version = PROTOCOL_VERSION
        raise ProtocolError(_reason(exc, version)) from None
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"not JSON: {exc}{_near(frame, str(exc))}") from None


def decode_command(frame: bytes | str) -> Command:
    """Parse and check one command frame (collector to reporter); raise ProtocolError if it is not one."""
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    try:
        return _command_decoder.decode(frame)
    except msgspec.ValidationError as exc:
        raise ProtocolError(_reason(exc, PROTOCOL_VERSION)) from None
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"not JSON: {exc}") from None


def from_dict(obj: Any) -> Message:
    """A message from an already parsed JSON object (a recording's line), checked like a frame."""
    try:
        return msgspec.convert(obj, Message, str_keys=True)
    except msgspec.ValidationError as exc:
        raise ProtocolError(_reason(exc, obj.get("v", PROTOCOL_VERSION) if isinstance(obj, dict) else None)) from None


def _near(frame: bytes | str, error: str) -> str:
    """Which field the malformed byte is in ("t1" for ``"t1":NaN``), from msgspec's byte offset."""
    match = re.search(r"\(byte (\d+)\)", error)
    data = frame.encode(errors="replace") if isinstance(frame, str) else frame
    if match is None:
        return ""
    keys = re.findall(rb'"([A-Za-z_][A-Za-z0-9_]*)"\s*:', data[: int(match.group(1))])
    return f", in field {keys[-1].decode()}" if keys else ""


def _reason(exc: msgspec.ValidationError, version: Any) -> str:
    """msgspec's message in this protocol's words where they differ."""
    if version != PROTOCOL_VERSION:
        return f"protocol version {version!r}, expected {PROTOCOL_VERSION}"
    text = str(exc)
    bound = re.match(r"Expected `\w+` >= (\d)[.0]* - at `\$\.(\w+)`", text)
    if bound is not None:
        return (
            f"{bound.group(2)} must not be negative"
            if bound.group(1) == "0"
            else f"{bound.group(2)} must be at least 1"
        )
    if text.startswith("Expected `object`"):
        return "a frame must be a JSON object"
    if "at `$.type`" in text:
        return f"unknown message type: {text}"
    return text
