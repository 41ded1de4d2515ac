"""The commands: the only frames that travel from the dashboard to a reporter."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, Union

import msgspec
from msgspec import Meta

from gputop.protocol.diagnostics import MAX_CAPTURE_STEPS
from gputop.protocol.limits import PROTOCOL_VERSION, Count, Text, TypeName, _Message


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
