"""DDP's sampled timings over a span: each sampled iteration counted once, means weighted by the iterations.

DDP times every Nth iteration itself (its logging data); a reporter sends the
newest sample with each window, so one sample repeats in the windows until the
next.  A span keeps one ``DdpTimings`` per distinct sample and averages them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from gputop.combine import COMBINE, DDP_MEAN, share_of_step
from gputop.protocol import Window

# DDP's first iteration rebuilds its gradient buckets in the order gradients
# became ready, and pays lazy allocation: its timings are no typical step's.
DDP_WARMUP_ITERATIONS = 1


# DDP's per-iteration figures (gputop.combine: a mean weighted by the iterations each window
# averaged), and the exposed comm each window derives from two of them.
DDP_FIGURES: tuple[str, ...] = (*(name for name, how in COMBINE.items() if how is DDP_MEAN), "exposed_comm_s")


class DdpTimings(msgspec.Struct, frozen=True, gc=False):
    """What one sampled DDP iteration adds: each figure times the iterations it averages, and those iterations.

    A struct the garbage collector never tracks (numbers only): a span holds one per
    sample, and at 1,024 ranks 41,000 tracked tuple subclasses (NamedTuples, which the
    collector never untracks) made every full collection ~100 ms longer.
    """

    sums: tuple[float, ...]  # per DDP_FIGURES
    counts: tuple[int, ...]  # per DDP_FIGURES: the iterations behind each sum, 0 where not measured
    warmup: bool  # it includes DDP's first iteration(s)
    exposed_frac: float | None  # its exposed comm over its window's mean step, for the error band


def ddp_timings(w: Window) -> DdpTimings:
    n = w.ddp_steps or 1
    values = [getattr(w, name) for name in DDP_FIGURES]
    exposed, timed = w.exposed_comm_s, w.timed
    return DdpTimings(
        tuple(0.0 if v is None else v * n for v in values),
        tuple(0 if v is None else n for v in values),
        covers_ddp_warmup(w),
        share_of_step(exposed, w.step_time_sum_s / timed) if exposed is not None and timed > 0 else None,
    )


@dataclass(frozen=True)
class DdpMeans:
    """The per-iteration means of DDP's figures over a rank's distinct samples."""

    means: dict[str, float | None]  # per DDP_FIGURES
    exposed_comm_fracs: list[float]  # each sample's exposed comm over its window's mean step, for the error band

    @classmethod
    def of(cls, samples: Sequence[DdpTimings]) -> DdpMeans:
        """Each figure's mean, each sample weighted by the iterations it averages.

        DDP's first iteration is left out when later ones are known: it rebuilds
        the gradient buckets and pays one-time allocation, so it is no typical step.
        """
        samples = [s for s in samples if not s.warmup] or samples
        sums = [sum(column) for column in zip(*(s.sums for s in samples), strict=True)] if samples else []
        counts = [sum(column) for column in zip(*(s.counts for s in samples), strict=True)] if samples else []
        means = {name: (sums[i] / counts[i] if samples and counts[i] else None) for i, name in enumerate(DDP_FIGURES)}
        return cls(means, [frac for s in samples if (frac := s.exposed_frac) is not None])


def ddp_key(w: Window) -> int:
    """The sampled iteration a window's DDP figures come from (a window without one is its own sample)."""
    return w.ddp_iteration if w.ddp_iteration is not None else -w.seq


def covers_ddp_warmup(w: Window) -> bool:
    """Whether the window's DDP figures include DDP's first iteration(s)."""
    return w.ddp_iteration is not None and w.ddp_iteration - (w.ddp_steps or 1) < DDP_WARMUP_ITERATIONS
