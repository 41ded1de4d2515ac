"""model_config, DDP side: how DistributedDataParallel was built, where a setting costs time.

Read from the facts DDP's own logging data gives once it has run (each rank's
hello): whether ``find_unused_parameters`` found anything unused, the gradient
buckets against the gradients' size, ``gradient_as_bucket_view``.  These hold
on the CPU as on CUDA.  DDP reports no cost for them, so none is estimated.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputop.diagnose.findings import Cause, Evidence, Severity
from gputop.diagnose.thresholds import (
    DDP_BIG_GRADIENT_BYTES,
    DDP_MANY_BUCKETS,
    DDP_SMALL_BUCKET_BYTES,
)
from gputop.model.figures import RankFigures

KIB = 1024.0
MIB = 1024.0 * 1024.0


@dataclass(frozen=True)
class Problem:
    """One setting that wastes the hardware: how bad, the numbers, what it is, the fix."""

    severity: Severity
    evidence: Evidence
    what: str
    fix: str
    explains: tuple[Cause, ...] = ()  # the symptoms it causes, of those symptoms.EXPLAINS lets model_config take in


def ddp_problems(rank: RankFigures) -> list[Problem]:
    """The DDP settings worth changing, from one rank's facts (the script builds DDP alike on every rank)."""
    hello = rank.hello
    problems = []
    if hello.ddp_find_unused_parameters and hello.ddp_unused_parameter_bytes == 0 and not hello.ddp_static_graph:
        problems.append(
            Problem(
                "warn",
                Evidence("unused_parameter_bytes", 0, 0, op="=="),
                "find_unused_parameters=True finds no unused parameter: an extra autograd graph traversal "
                "every iteration",
                "DDP(model, find_unused_parameters=False) (Hugging Face: "
                "TrainingArguments(ddp_find_unused_parameters=False)); if some iterations do skip parameters, "
                "static_graph=True instead",
            )
        )
    buckets, gradient_bytes = hello.ddp_buckets, hello.ddp_gradient_bytes
    if buckets and gradient_bytes:
        mean_bytes = gradient_bytes / buckets
        if buckets >= DDP_MANY_BUCKETS and mean_bytes < DDP_SMALL_BUCKET_BYTES:
            cap = f" (bucket_cap_mb={hello.ddp_bucket_cap_bytes / MIB:.3g} now)" if hello.ddp_bucket_cap_bytes else ""
            problems.append(
                Problem(
                    "warn",
                    Evidence("ddp_buckets", buckets, DDP_MANY_BUCKETS, op=">="),
                    f"{buckets} gradient buckets of {mean_bytes / KIB:.0f} KiB: each all-reduce pays its latency",
                    f"DDP(model, bucket_cap_mb=25) (PyTorch's default){cap}: fewer, larger all-reduces that still "
                    "overlap backward",
                    explains=("communication",),  # the exposed exchange is those all-reduces' latency
                )
            )
    if hello.ddp_gradient_as_bucket_view is False and (gradient_bytes or 0) >= DDP_BIG_GRADIENT_BYTES:
        problems.append(
            Problem(
                "info",
                Evidence("gradient_bytes_copied_mib", (gradient_bytes or 0) / MIB, DDP_BIG_GRADIENT_BYTES / MIB, "MiB"),
                "gradient_as_bucket_view=False: gradients are copied into the buckets every step",
                "DDP(model, gradient_as_bucket_view=True): no copy, and a gradients' worth of memory saved",
            )
        )
    return problems
