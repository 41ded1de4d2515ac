"""The process's own CUDA and NCCL switches that decide what gputop may time on the GPU, read from its environment.

gputop never sets them: each is the script's or its launcher's, and each changes what an event or a duration costs.
"""

from __future__ import annotations

import os

# Environment variables under which NCCL records a start event for every collective, so ``_get_duration``
# answers (c10d ``ProcessGroupNCCL``: TORCH_NCCL_ENABLE_TIMING, and desync debugging turns timing on too).
NCCL_TIMING_ENV = ("TORCH_NCCL_ENABLE_TIMING", "NCCL_ENABLE_TIMING", "TORCH_NCCL_DESYNC_DEBUG")
# Why a collective issued on a side stream has no time in flight where the GPU has one hardware queue.
ONE_CONNECTION = (
    "CUDA_DEVICE_MAX_CONNECTIONS=1: no timing event is recorded on a communication stream there (one hardware "
    "queue: an event between two collectives costs their overlap with compute, pytorch issue #143890), so a "
    "collective issued on a side stream has no time in flight; its exposed wait is still timed"
)


def one_connection(environ: dict[str, str] | None = None) -> bool:
    """Whether the process runs with one hardware queue per GPU (Megatron and Transformer Engine set it)."""
    env = os.environ if environ is None else environ
    return env.get("CUDA_DEVICE_MAX_CONNECTIONS", "").strip() == "1"


def nccl_timing_on(environ: dict[str, str] | None = None) -> bool:
    """Whether this process asked NCCL to time its collectives (gputop never turns it on: it is not free,
    and it has been seen to break NCCL's overlap with compute, pytorch issue #143890)."""
    env = os.environ if environ is None else environ
    return any(env.get(name, "").strip().lower() in ("1", "true", "yes", "y") for name in NCCL_TIMING_ENV)
