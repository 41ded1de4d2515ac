"""The step-time sketch: the mergeable quantile summary every window carries, and its math.

Pure (the standard library's ``math`` only), so the reporter that fills a
window's sketch, the wire format that bounds it and the model that reads
quantiles from merged sketches share one definition without importing each
other.  Lived in the wire module until issue #23: figure math is not the
wire's business.
"""

from __future__ import annotations

import functools
import math

# Step-time sketch: log-spaced buckets with relative accuracy SKETCH_ACCURACY
# (DDSketch, Masson et al., VLDB 2019): every step duration in bucket i lies in
# (MIN * GAMMA**(i-1), MIN * GAMMA**i], and the bucket's value 2 * MIN * GAMMA**i
# / (GAMMA + 1) is within 1% of each of them, so any quantile merged across
# windows and ranks is within 1% of the exact one.  Mergeable: counts add.
SKETCH_ACCURACY = 0.01
SKETCH_GAMMA = (1 + SKETCH_ACCURACY) / (1 - SKETCH_ACCURACY)
SKETCH_MIN_S = 1e-6  # bucket 0 holds every step of 1 us or less
SKETCH_MAX_BUCKET = 1200  # 1 us * GAMMA**1200 ~ 7 h: longer steps land in the last bucket
_LOG_GAMMA = math.log(SKETCH_GAMMA)

# The first protocol's step-time histogram, 4 buckets per octave from 100 us
# (up to 9% off): still read from recordings made before the sketch.
HIST_BASE_S = 1e-4
HIST_BUCKETS_PER_OCTAVE = 4
HIST_MAX_BUCKET = 100


def sketch_bucket(seconds: float) -> int:
    """The sketch bucket a step duration falls into."""
    if seconds <= SKETCH_MIN_S:
        return 0
    return min(math.ceil(math.log(seconds / SKETCH_MIN_S) / _LOG_GAMMA), SKETCH_MAX_BUCKET)


@functools.lru_cache(maxsize=2 * SKETCH_MAX_BUCKET)  # the figures read a few buckets per rank per refresh
def sketch_value_s(index: int) -> float:
    """The duration a bucket stands for: within SKETCH_ACCURACY of every duration in it."""
    index = min(max(index, 0), SKETCH_MAX_BUCKET)
    if index == 0:
        return SKETCH_MIN_S
    return 2 * SKETCH_MIN_S * SKETCH_GAMMA**index / (SKETCH_GAMMA + 1)


def sketch_quantile_s(sketch: dict[int, int], q: float) -> float | None:
    """The q-quantile (0..1) of a merged sketch, nearest rank as for exact values; None if empty.

    The step at 0-based rank ``min(int(q * n), n - 1)`` of the sorted durations,
    the same rank ``gputop.reporter.window.percentile`` takes, so the sketch and
    the exact figure differ only by the bucket's width.
    """
    return sketch_quantiles_s(sketch, (q,))[0]


def sketch_quantiles_s(sketch: dict[int, int], qs: tuple[float, ...]) -> tuple[float | None, ...]:
    """Several quantiles (``qs`` ascending) of a sketch in one walk of its buckets, as ``sketch_quantile_s``."""
    total = sum(sketch.values())
    if total == 0:
        return (None,) * len(qs)
    targets = [min(int(q * total), total - 1) for q in qs]
    found: list[float | None] = []
    seen = 0
    for index in sorted(sketch):
        seen += sketch[index]
        while len(found) < len(targets) and seen > targets[len(found)]:
            found.append(sketch_value_s(index))
        if len(found) == len(targets):
            break
    found += [sketch_value_s(max(sketch))] * (len(targets) - len(found))  # unreachable with counts >= 0
    return tuple(found)


def legacy_hist_to_sketch(hist: dict[int, int]) -> dict[int, int]:
    """A first-protocol histogram as sketch counts, each bucket at its geometric middle."""
    sketch: dict[int, int] = {}
    for index, count in hist.items():
        mid_s = HIST_BASE_S * 2 ** ((index - 0.5) / HIST_BUCKETS_PER_OCTAVE) if index > 0 else HIST_BASE_S
        bucket = sketch_bucket(mid_s)
        sketch[bucket] = sketch.get(bucket, 0) + count
    return sketch
