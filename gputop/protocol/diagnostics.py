"""What a rank sends when asked or when it may: a profile of its next steps, where its training thread is."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import msgspec
from msgspec import Meta

from gputop.protocol.limits import PROTOCOL_VERSION, Count, Seconds, Text, _Message

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


MAX_GROUPS_SENT = 16  # process groups a stacks message numbers (a 3-D mesh has a handful)


class GroupCalls(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One process group's collectives on one rank: torch's number and the collective tap's counts.

    On the wire an array, ``["dp", 88, 40, 39, "all_gather", 1048576, true]``: the group's count is 88, the tap saw
    40 issued and 39 completed, the newest an all_gather of 1 MiB, and the training thread is in it now, so it is
    collective #88 on dp.  ``["tp", 90, 52, 50, "all_reduce", 4096, false, 89, "all_gather", 8192]``: the thread
    waits for collective #89 on tp, an all_gather issued before the newest (DTensor's ``wait_tensor``).
    """

    group: Annotated[str, Meta(max_length=64)]  # the tap's name: a DeviceMesh dimension ("dp"), "world", "pg N"
    # torch's count of the collectives issued on the group on this rank (DDP's all-reduce from C++ and barriers
    # included): equal across ranks for the same collective.  None: this torch or backend cannot say.
    seq: Count | None
    issued: Count  # through the tap, since a collector listened
    completed: Count  # of those, returned (or waited for, for a Work)
    kind: Annotated[str, Meta(max_length=32)] = ""  # the newest issued through the tap ("" none)
    bytes: Count | None = None  # its size, what the rank sends (None: none issued through the tap)
    inside: bool = False  # the training thread is in that newest one now: it is collective number ``seq``
    # The training thread waits now for an asynchronous collective issued earlier on the group (a functional
    # collective's wait_tensor, a Work's wait): its number (torch's, as it was issued), kind and size.
    waits: Count | None = None
    waits_kind: Annotated[str, Meta(max_length=32)] = ""
    waits_bytes: Count | None = None


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
    # While no step has finished for a few seconds: each process group's numbers (``GroupCalls``), the default
    # group's first.  None: not stuck, or a reporter that does not count them.
    groups: Annotated[tuple[GroupCalls, ...], Meta(max_length=MAX_GROUPS_SENT)] | None = None

    def __post_init__(self) -> None:
        if sum(frame.count for frame in self.top) > self.samples:
            raise ValueError("stacks: the top places count more samples than were taken")


# The optional upstream types: a reporter sends one only on a connection whose collector accepted it.
OPTIONAL_TYPES: tuple[str, ...] = ("stacks",)
