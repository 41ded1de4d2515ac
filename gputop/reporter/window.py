"""A window's step figures from the training thread's step marks: pure arithmetic.

Exact p50/p95/max of the window's own steps, their sum, the mergeable
step-time sketch, the slowest steps with their loader wait (for stalls),
when the rank was ready to exchange gradients in its steps and, where the
collective tap times the step's waits, each step's own work (both to tell
which rank the others waited for), loader wait and batches.  The probes add the rest.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from gputop.combine import ReadyStep, ready_steps_kept
from gputop.protocol import SLOW_STEPS_KEPT, CollectiveTimes
from gputop.reporter.clock import StepMark
from gputop.sketch import sketch_bucket


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of sorted values, nearest rank."""
    index = min(int(q * len(ordered)), len(ordered) - 1)
    return ordered[index]


def step_fields(marks: Sequence[StepMark], batch_size: int | None, first_step: int = 1) -> dict[str, Any]:
    """The Window fields that come from the step marks alone (not ``step_total``, a running count).

    ``first_step`` is the number of the first mark's step (the reporter's count): the slow
    steps carry theirs, so a stall's period is read from which steps stalled.
    One pass over the marks (the reporter thread does this every window; three passes and a sort
    of every step took twice as long).
    """
    durations: list[float] = []
    timed: list[tuple[float, float, int]] = []  # (duration, loader wait, step number) of the timed steps
    ready: list[ReadyStep] = []  # (step number, ready seconds, its last forward's, its input's elements; -1: untimed)
    work: list[ReadyStep] = []  # (step number, the step less its exposed collectives, -1, -1): phases from hooks
    sketch: dict[int, int] = {}
    loader_wait_s = optimizer_s = 0.0
    batches = optimized = 0
    number = first_step
    for mark in marks:
        duration = mark[1]
        batches += mark[3]
        if duration is not None:
            durations.append(duration)
            timed.append((duration, mark[2], number))
            loader_wait_s += mark[2]
            bucket = sketch_bucket(duration)
            sketch[bucket] = sketch.get(bucket, 0) + 1
            if mark[4] is not None:
                optimizer_s += mark[4]
                optimized += 1
            if mark[8] is not None:  # the collectives' exposed time, timed by the tap (phases from hooks)
                work.append((number, max(duration - mark[8], 0.0), -1.0, -1))
        if mark[5] is not None:
            # The last forward's length, when it is this step's: it began after the step did (else untimed).
            forward = mark[9]
            if forward is None or not 0.0 <= forward <= mark[5]:
                ready.append((number, mark[5], -1.0, -1))
            else:
                ready.append((number, mark[5], forward, mark[10]))
        number += 1
    durations.sort()
    fields: dict[str, Any] = {
        "steps": len(marks),
        "timed_steps": len(durations),
        "step_time_sum_s": sum(durations),
        "step_sketch": sketch,
        "loader_wait_s": loader_wait_s,
        "loader_batches": batches,
    }
    if optimized:
        fields["optimizer_s"] = optimizer_s
    if timed:
        # The window's slowest steps with their loader wait: where a stall spent its time (ties: the later step).
        slowest = heapq.nlargest(SLOW_STEPS_KEPT, timed, key=lambda step: (step[0], step[2]))
        fields["slow_steps"] = tuple((duration, wait) for duration, wait, _ in slowest)
        fields["slow_step_numbers"] = tuple(number for _, _, number in slowest)
    fields.update(kept_step_fields(ready, work))
    fields.update(quantile_fields(durations))
    if batch_size and batches:
        fields["samples"] = batches * int(batch_size)
    return fields


def quantile_fields(ordered: Sequence[float]) -> dict[str, float]:
    """The window's exact step-time p50, p95 and max, from its sorted durations ({} when none was timed)."""
    if not ordered:
        return {}
    return {
        "step_time_p50_s": percentile(ordered, 0.5),
        "step_time_p95_s": percentile(ordered, 0.95),
        "step_time_max_s": ordered[-1],
    }


def kept_step_fields(ready: list[ReadyStep], work: list[ReadyStep]) -> dict[str, Any]:
    """The kept steps' readiness (with their last forward and its input, where every kept step has them) and
    their own work, each thinned alike by step number (``ready_steps_kept``); µs: a few bytes each on the wire."""
    fields: dict[str, Any] = {}
    kept = ready_steps_kept(ready) if ready else ()
    if kept:
        fields["ready_step_numbers"] = tuple(step[0] for step in kept)
        fields["ready_s"] = tuple(round(step[1], 6) for step in kept)
        if all(step[2] >= 0 for step in kept):
            fields["ready_forward_s"] = tuple(round(step[2], 6) for step in kept)
            if all(step[3] >= 0 for step in kept):
                fields["ready_input_numel"] = tuple(step[3] for step in kept)
    kept_work = ready_steps_kept(work) if work else ()
    if kept_work:
        fields["work_step_numbers"] = tuple(step[0] for step in kept_work)
        fields["work_s"] = tuple(round(step[1], 6) for step in kept_work)
    return fields


def hook_phase_fields(marks: Sequence[StepMark], collectives: Sequence[CollectiveTimes]) -> dict[str, Any]:
    """Forward, backward and communication a step, from the hooks' marks and the timed collectives.

    The same fields DDP's logger fills, with the same meaning, for every other stack: ``comm_s`` is the
    collectives' time in flight a step (at least the exposed part), ``overlap_s`` what of it was hidden
    behind the rank's other work.  Means over the steps the hooks timed; {} when they timed none.
    """
    phased = [m for m in marks if m.duration_s is not None and m.forward_s is not None]
    if not phased:
        return {}
    steps = len(phased)
    exposed_s = sum(m.exposed_comm_s or 0.0 for m in phased) / steps
    times = [c.busy_s for c in collectives if c.busy_s is not None]
    busy_s = max(sum(times) / steps, exposed_s) if times else exposed_s
    return {
        "forward_s": sum(m.forward_s or 0.0 for m in phased) / steps,
        "backward_s": sum(m.backward_s or 0.0 for m in phased) / steps,
        "comm_s": busy_s,
        "overlap_s": busy_s - exposed_s,
        "ddp_steps": steps,
        "phases_from": "hooks",
    }


def ddp_exchange(
    fields: dict[str, Any], buckets: int | None, gradient_bytes: int | None, group: str, ranks: int | None = None
) -> CollectiveTimes | None:
    """DDP's gradient all-reduce as the window's collective, from its logger's figures: the same table for every stack.

    DDP's reducer issues it from C++, where the collective tap sees nothing.  Its figures are per
    iteration, over ``ddp_steps`` iterations (or DDP's latest sampled one, standing for the window's
    steps); the calls are its buckets, the bytes every parameter's gradient.  None until DDP has said
    how it is built (its first iterations) or timed one.
    """
    comm = fields.get("comm_s")
    if comm is None or not buckets or gradient_bytes is None:
        return None
    steps = fields.get("ddp_steps") or fields.get("timed_steps") or fields.get("steps") or 0
    if not steps:
        return None
    exposed = max(comm - (fields.get("overlap_s") or 0.0), 0.0)
    return CollectiveTimes(
        "all_reduce", group, buckets * steps, gradient_bytes * steps, comm * steps, exposed * steps, ranks
    )


def flops_fields(marks: Sequence[StepMark], work: Sequence[tuple[int | None, bool]]) -> dict[str, Any]:
    """The FLOPs of the window's steps whose work is known, the time they took and how many they were.

    ``work`` is each step's (FLOPs or None, ran under counting) in the order of ``marks``, one for each: a step
    whose FLOPs are unknown, whose time is unknown (a reporter's first), or that ran under the counting (its
    operators paid the counter's toll) is left out of all three.  {} when none is left.
    """
    flops_sum, time_s, steps = 0, 0.0, 0
    for mark, (flops, counted) in zip(marks, work, strict=False):
        if flops and not counted and mark.duration_s is not None:
            flops_sum += flops
            time_s += mark.duration_s
            steps += 1
    if not steps:
        return {}
    return {"flops_sum": float(flops_sum), "flops_time_s": time_s, "flops_steps": steps}
