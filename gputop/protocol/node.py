"""What a host's node sampler sends: its GPUs' readings, speaking for the host, not a rank."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from msgspec import Meta

from gputop.protocol.limits import PROTOCOL_VERSION, _Message


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
