"""The wire's limits as types (msgspec checks them while it decodes), the protocol version, the message base."""

from __future__ import annotations

from typing import Annotated, ClassVar, Final

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

# The steps each window gives its readiness for (``Window.ready_s``): every step up to this many, else
# the step numbers divisible by the smallest power of two that leaves at most this many.  Thinned by
# step number, every rank keeps the same steps, so the collector can compare ranks step by step.
READY_STEPS_KEPT = 32

# The collectives a window names, one entry per (kind, process group): a job with a data-parallel, a
# tensor-parallel and a pipeline group issues a handful of kinds on each, far below this.
COLLECTIVES_KEPT = 32

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
ReadyStepNumbers = Annotated[tuple[Count, ...], Meta(max_length=READY_STEPS_KEPT)]
ReadyTimes = Annotated[tuple[Seconds, ...], Meta(max_length=READY_STEPS_KEPT)]


# The name of a message type, in a hello's ``sends`` and a collector's ``accepts``.
TypeName = Annotated[str, Meta(max_length=32)]


class _Message(msgspec.Struct, frozen=True, omit_defaults=True, kw_only=True, tag_field="type"):
    """What every message shares.  ``v`` is written first by ``encode``; absent, it reads as this version."""

    TYPE: ClassVar[str]
