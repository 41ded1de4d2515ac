"""Forward, backward and communication a step on the GPU clock, for every stack but DDP on CUDA (reporter thread).

The events and every CUDA call on them belong to ``CudaTimeline``; this probe turns what it harvested into the
window's fields, the same ones DDP's logger and the hooks fill (``phases_from = "cuda events"``), and the
communication it timed into rows of ``Window.collectives`` (merged with the collective tap's calls and bytes
by the reporter: the tap counts, the events time).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gputop.combine import ready_steps_kept
from gputop.protocol import CollectiveTimes
from gputop.reporter.clock import StepMark
from gputop.reporter.cuda_timeline import CudaTimeline
from gputop.reporter.timeline_reader import Harvest, StepTimes

PHASES_FROM = "cuda events"


class CudaPhaseProbe:
    """The window's phases from the timeline's completed events; N/A with the reason where it has none.

    ``name_group`` names a process group as the collective probe does (its DeviceMesh dimension); the
    reporter sets it once the job is known to run in a process group.
    """

    name = "cuda_phases"

    def __init__(self, timeline: CudaTimeline | None, *, not_measured: str | None = None) -> None:
        self.timeline = timeline
        self.not_measured = not_measured
        self.name_group: Callable[[Any], str] = lambda group: "world"

    def read(self, marks: list[StepMark]) -> dict[str, Any]:
        timeline = self.timeline
        if timeline is None:
            return {}
        harvest = timeline.harvest()
        self.not_measured = timeline.why_not()
        return phase_fields(harvest, self.name_group)


def phase_fields(harvest: Harvest, name_group: Callable[[Any], str]) -> dict[str, Any]:
    """The Window fields of one harvest: means over the steps with a training forward, the rows timed."""
    fields: dict[str, Any] = {}
    rows = [
        CollectiveTimes(kind, name_group(group)[:64], 0, 0, max(in_flight or 0.0, exposed), exposed)
        for kind, group, in_flight, exposed in harvest.collectives
    ]
    if rows:
        fields["collectives"] = tuple(rows)
    phased = [s for s in harvest.steps if s.forward_s is not None]
    if phased:
        steps = len(phased)
        exposed_s = sum(s.exposed_s for s in phased) / steps
        # In flight where it was timed (a collective's own events, NCCL's durations), at least the exposed part.
        timed = [in_flight for _, _, in_flight, _ in harvest.collectives if in_flight is not None]
        comm_s = max(sum(timed) / steps, exposed_s) if timed else exposed_s
        fields.update(
            forward_s=sum(s.forward_s or 0.0 for s in phased) / steps,
            backward_s=sum(s.backward_s or 0.0 for s in phased) / steps,
            comm_s=comm_s,
            overlap_s=comm_s - exposed_s,
            ddp_steps=steps,
            phases_from=PHASES_FROM,
        )
    if harvest.steps:
        fields.update(work_fields(harvest.steps))
    return fields


def work_fields(steps: Sequence[StepTimes]) -> dict[str, Any]:
    """Each step's GPU time less its exposed communication, for the steps a window keeps (``ready_steps_kept``:
    chosen by number alone, so ranks that made the same steps keep the same ones and can be compared)."""
    kept = ready_steps_kept([(s.number, max(s.step_s - s.exposed_s, 0.0), -1.0, -1) for s in steps])
    return {
        "work_step_numbers": tuple(step[0] for step in kept),
        "work_s": tuple(round(step[1], 6) for step in kept),
    }
