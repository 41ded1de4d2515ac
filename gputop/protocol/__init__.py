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

A package by idea: ``limits`` (the version, the limits as types), ``run`` (what
a rank says: hello, window, event, bye), ``diagnostics`` (captures and stacks),
``node`` (a host's GPUs), ``commands`` (dashboard to reporter) and ``codec``
(frames in and out).  Everything is importable from ``gputop.protocol``.
"""

from __future__ import annotations

from gputop.protocol.codec import (
    MESSAGE_TYPES,
    Message,
    Upstream,
    decode,
    decode_command,
    decode_upstream,
    encode,
    from_dict,
    to_dict,
)
from gputop.protocol.commands import (
    MAX_FINDINGS_NOTICED,
    Accepts,
    CaptureRequest,
    Command,
    FindingBrief,
    FindingsNotice,
)
from gputop.protocol.diagnostics import (
    MAX_CAPTURE_STEPS,
    MAX_GROUPS_SENT,
    MAX_STACKS_TOP,
    OPTIONAL_TYPES,
    STACKS_TOP,
    TOP_OPS,
    CaptureResult,
    Collective,
    FrameText,
    GroupCalls,
    OpTime,
    SampledFrame,
    StackFrame,
    Stacks,
    Where,
)
from gputop.protocol.limits import (
    COLLECTIVES_KEPT,
    MAX_FRAME_BYTES,
    MAX_INT,
    MAX_STRING_CHARS,
    PROTOCOL_VERSION,
    READY_STEPS_KEPT,
    SLOW_STEPS_KEPT,
    AtLeastOne,
    Bucket,
    Count,
    LegacyBucket,
    ProtocolError,
    Seconds,
    SlowStepNumbers,
    SlowSteps,
    Text,
    TypeName,
)
from gputop.protocol.node import (
    Gpus,
)
from gputop.protocol.run import (
    MAX_DIGESTS_SENT,
    Bye,
    CollectiveTimes,
    DigestSite,
    Event,
    GroupDigests,
    Hello,
    Window,
    joined_digests,
)

__all__ = [
    "COLLECTIVES_KEPT",
    "MAX_CAPTURE_STEPS",
    "MAX_DIGESTS_SENT",
    "MAX_FINDINGS_NOTICED",
    "MAX_FRAME_BYTES",
    "MAX_GROUPS_SENT",
    "MAX_INT",
    "MAX_STACKS_TOP",
    "MAX_STRING_CHARS",
    "MESSAGE_TYPES",
    "OPTIONAL_TYPES",
    "PROTOCOL_VERSION",
    "READY_STEPS_KEPT",
    "SLOW_STEPS_KEPT",
    "STACKS_TOP",
    "TOP_OPS",
    "Accepts",
    "AtLeastOne",
    "Bucket",
    "Bye",
    "CaptureRequest",
    "CaptureResult",
    "Collective",
    "CollectiveTimes",
    "Command",
    "Count",
    "DigestSite",
    "Event",
    "FindingBrief",
    "FindingsNotice",
    "FrameText",
    "Gpus",
    "GroupCalls",
    "GroupDigests",
    "Hello",
    "LegacyBucket",
    "Message",
    "OpTime",
    "ProtocolError",
    "SampledFrame",
    "Seconds",
    "SlowStepNumbers",
    "SlowSteps",
    "StackFrame",
    "Stacks",
    "Text",
    "TypeName",
    "Upstream",
    "Where",
    "Window",
    "decode",
    "decode_command",
    "decode_upstream",
    "encode",
    "from_dict",
    "joined_digests",
    "to_dict",
]
