"""A step's phases and its communication waits on the GPU clock, against a simulated device (no GPU, no torch).

``SimCuda`` (tests/support/sim_cuda.py) queues work on streams and runs it on a clock the test moves: a
kernel takes the time it is given, a wait lasts until the event it waits for, an event completes when its
stream reaches it.  The timeline's figures are compared with that timeline; what the GPU has not reached yet
must wait for a later read; a stream that never finishes must not make the training thread block, raise or
hold ever more events; and every CUDA call must be made with the model's device current.
"""

from __future__ import annotations

import gc
import math
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from gputop.protocol import Window
from gputop.reporter import collective_cuda
from gputop.reporter.clock import StepClock
from gputop.reporter.collective_calls import Where
from gputop.reporter.collectives import CollectiveTap
from gputop.reporter.cuda_switches import nccl_timing_on
from gputop.reporter.cuda_timeline import CudaTimeline
from gputop.reporter.probes.cuda_phases import CudaPhaseProbe, phase_fields
from gputop.reporter.rank_cuda import RankCuda
from gputop.reporter.timeline_reader import Harvest
from tests.support.sim_cuda import SimCuda, SimEvent, SimStream

MODEL_GPU = 3  # the model's device; the test's threads never choose one, so device 0 stays current on them
MS = 1e-3


def timeline_on(sim: SimCuda, **kwargs: Any) -> CudaTimeline:
    return CudaTimeline(RankCuda(MODEL_GPU, sim), **kwargs)


def train_step(
    sim: SimCuda, timeline: CudaTimeline, forward_ms: float, backward_ms: float, optimizer_ms: float
) -> None:
    """One step as the hooks see it, its kernels queued on the compute stream as the host launches them."""
    compute = sim.default[MODEL_GPU]
    timeline.forward_started()
    sim.run(compute, forward_ms)
    timeline.forward_done()
    sim.run(compute, backward_ms)  # loss and backward: from the forward's end to the optimizer
    optimizer_step(sim, timeline, optimizer_ms)


def optimizer_step(sim: SimCuda, timeline: CudaTimeline, ms: float = 0.0) -> None:
    """The optimizer's step, its kernels on the compute stream, and the step mark its hooks make."""
    timeline.optimizer_started()
    if ms:
        sim.run(sim.default[MODEL_GPU], ms)
    timeline.record_step()  # the primary optimizer's post-hook marks the step before the timeline's hook runs
    timeline.optimizer_done()


def test_the_phases_of_each_step_are_the_time_its_kernels_took_on_the_device() -> None:
    sim = SimCuda()
    timeline = timeline_on(sim)
    for _ in range(4):  # the host runs ahead: everything is queued at once, and the GPU works through it
        train_step(sim, timeline, forward_ms=10, backward_ms=20, optimizer_ms=3)
    sim.advance(1000)

    steps = timeline.harvest().steps
    # The first step mark has no start to time from (as on the host); steps 2-4 are whole.
    assert [s.number for s in steps] == [2, 3, 4]
    for s in steps:
        assert s.step_s == pytest.approx(33 * MS)
        assert (s.forward_s, s.backward_s, s.optimizer_s) == pytest.approx((10 * MS, 20 * MS, 3 * MS))
        assert s.exposed_s == 0.0

    fields = phase_fields(Harvest(steps=steps), lambda group: "world")
    assert fields["phases_from"] == "cuda events" and fields["ddp_steps"] == 3
    assert (fields["forward_s"], fields["backward_s"]) == pytest.approx((10 * MS, 20 * MS))
    assert fields["comm_s"] == 0.0 and fields["overlap_s"] == 0.0


def test_host_time_between_launches_is_not_gpu_time() -> None:
    """A host that stalls between two kernels leaves the GPU idle: the GPU clock shows the idle gap in the span
    it falls in, and the kernels' time where the GPU ran them, never the host's launch times."""
    sim = SimCuda()
    timeline = timeline_on(sim)
    compute = sim.default[MODEL_GPU]
    train_step(sim, timeline, 1, 1, 1)
    sim.advance(100)  # everything so far has run
    timeline.forward_started()
    sim.run(compute, 8)
    sim.advance(0.5)  # launching takes the host half a millisecond; the kernel takes 8
    timeline.forward_done()
    sim.advance(30)  # the host stalls (a loader, a print) before backward: the GPU idles
    sim.run(compute, 5)
    optimizer_step(sim, timeline, 2)
    sim.advance(100)

    (step,) = timeline.harvest().steps
    assert step.forward_s == pytest.approx(8 * MS)  # not the 0.5 ms the host spent launching it
    assert step.backward_s == pytest.approx((30 - 7.5 + 5) * MS)  # the idle gap after the forward, then backward
    assert step.optimizer_s == pytest.approx(2 * MS)


def test_events_the_gpu_has_not_reached_wait_for_a_later_read_and_nothing_blocks() -> None:
    sim = SimCuda()
    timeline = timeline_on(sim)
    for _ in range(5):
        train_step(sim, timeline, forward_ms=10, backward_ms=20, optimizer_ms=3)

    sim.advance(70)  # the GPU is in the third step: steps 1 and 2 have ended, step 3 not yet
    first = timeline.harvest().steps
    assert [s.number for s in first] == [2]
    assert timeline.harvest().steps == []  # asking again changes nothing, and returns at once

    sim.advance(1000)
    rest = timeline.harvest().steps
    assert [s.number for s in rest] == [3, 4, 5]
    assert all(s.step_s == pytest.approx(33 * MS) for s in rest)
    assert not sim.of("synchronize")  # the simulation has none to call: nothing waited for the device


def test_a_stream_that_never_finishes_runs_the_pool_dry_and_the_training_thread_stops_recording() -> None:
    sim = SimCuda()
    timeline = timeline_on(sim, pool_events=32)
    compute = sim.default[MODEL_GPU]
    train_step(sim, timeline, 1, 1, 1)
    hung = sim.run(compute, math.inf)  # a kernel that never returns: nothing after it on the stream completes
    for _ in range(50):
        train_step(sim, timeline, 1, 1, 1)  # never raises into training
        sim.advance(10)
        timeline.harvest()  # the reporter thread's windows: they find nothing complete, and never wait
    recorded_while_hung = len(sim.of("record"))
    for _ in range(20):
        train_step(sim, timeline, 1, 1, 1)
    timeline_records = len(sim.of("record")) - recorded_while_hung
    assert timeline_records == 20  # only the GPU step time's own events (bounded on their own): none of ours

    assert timeline._made == 32 and len(timeline._pending) <= 33  # 32 events and the mark saying the step is lost
    assert timeline.lost_steps >= 60 and timeline.errors == 0
    probe = CudaPhaseProbe(timeline)
    assert probe.read([]) == {}
    assert probe.not_measured is not None and "had not completed the 32 CUDA events" in probe.not_measured

    sim.finish(hung, 5)  # the kernel ends after all: the events come back, and recording resumes at a step mark
    sim.advance(1000)
    timeline.harvest()
    for _ in range(3):
        train_step(sim, timeline, 2, 3, 1)
    sim.advance(1000)
    steps = timeline.harvest().steps
    assert len(steps) == 2 and all(s.forward_s == pytest.approx(2 * MS) for s in steps)


class Work:
    """An asynchronous NCCL work: its collective runs on NCCL's stream; ``wait()`` makes the current stream wait."""

    def __init__(self, sim: SimCuda, done: SimEvent) -> None:
        self.sim, self.done = sim, done

    def wait(self) -> bool:
        self.sim.current_stream(MODEL_GPU).wait_event(self.done)
        return True


class Tensor:
    """What the tap reads of a CUDA tensor."""

    nbytes = 4096
    is_cpu = False


def cuda_tap(sim: SimCuda, timeline: CudaTimeline) -> CollectiveTap:
    tap = CollectiveTap(StepClock())
    tap.timeline = timeline
    tap.on = True  # a collector listens
    return tap


def test_the_compute_streams_wait_for_a_side_stream_collective_is_the_delay_it_saw() -> None:
    """FSDP2's all-gather: issued on a side stream, the compute stream made to wait for it with wait_event."""
    sim = SimCuda()
    timeline = timeline_on(sim)
    tap = cuda_tap(sim, timeline)
    wait_event = collective_cuda.wrap_wait_event(tap, SimStream.wait_event)  # as installed on torch.cuda.Stream
    compute, side = sim.default[MODEL_GPU], sim.Stream(MODEL_GPU)
    group = object()

    def step(busy_ms: float, delay_ms: float) -> None:
        timeline.forward_started()
        sim.run(compute, 4)
        timeline.forward_done()
        issued = sim.Event()
        issued.record(compute)
        side.wait_event(issued)  # the collective starts where the compute stream is now (FSDP2's wait_stream)
        sim.run(compute, busy_ms)  # backward work the compute stream has before it needs the next parameters
        sim.run(side, delay_ms)  # the collective, on its own stream, from the same moment
        gathered = sim.Event()
        gathered.record(side)
        with tap.waits_for("all_gather", group):
            wait_event(side, gathered)  # a side stream waiting: no one's exposed time
            wait_event(compute, gathered)
        sim.run(compute, 6)
        optimizer_step(sim, timeline)

    step(1, 1)
    step(busy_ms=0, delay_ms=7)  # the compute stream idles the whole delay
    step(busy_ms=5, delay_ms=7)  # it had 5 ms of its own: 2 ms exposed
    step(busy_ms=9, delay_ms=7)  # the collective was hidden
    sim.advance(1000)
    harvest = timeline.harvest()

    assert [s.exposed_s for s in harvest.steps] == pytest.approx([7 * MS, 2 * MS, 0.0], abs=1e-9)
    # The exposed wait is in the backward span it fell in, and taken out of it.
    assert [s.backward_s for s in harvest.steps] == pytest.approx([6 * MS, 11 * MS, 15 * MS])
    ((kind, named, in_flight, exposed),) = harvest.collectives
    assert (kind, named, in_flight) == ("all_gather", group, None)  # in flight is the collective's own events'
    assert exposed == pytest.approx(9 * MS)


def test_a_wait_outside_fsdp2s_methods_or_on_a_side_stream_is_not_timed() -> None:
    sim = SimCuda()
    timeline = timeline_on(sim)
    tap = cuda_tap(sim, timeline)
    wait_event = collective_cuda.wrap_wait_event(tap, SimStream.wait_event)
    side = sim.Stream(MODEL_GPU)
    done = sim.Event()
    done.record(side)
    wait_event(sim.default[MODEL_GPU], done)  # a user's own stream sync: no scope, straight through
    with tap.waits_for("all_gather", object()):
        wait_event(sim.Stream(MODEL_GPU), done)
    assert not timeline._pending and len(sim.of("wait")) == 2  # both waits happened, untimed


def test_an_asynchronous_collectives_wait_is_exposed_and_it_is_in_flight_from_issue_to_the_waits_end() -> None:
    sim = SimCuda()
    timeline = timeline_on(sim)
    tap = cuda_tap(sim, timeline)
    compute, nccl = sim.default[MODEL_GPU], sim.Stream(MODEL_GPU)

    def all_reduce(tensor: Tensor, group: Any = None, async_op: bool = False) -> Work:
        issued = sim.Event()
        issued.record(sim.current_stream(MODEL_GPU))
        issued.wait(nccl)  # NCCL's stream starts where the compute stream was at the issue
        sim.run(nccl, 12)
        done = sim.Event()
        done.record(nccl)
        return Work(sim, done)

    collective = collective_cuda.wrap_collective(tap, all_reduce, all_reduce, "all_reduce", Where("tensor", 0, 1))
    wait = collective_cuda.wrap_wait(tap, Work.wait, Work.wait)
    train_step(sim, timeline, 1, 1, 1)
    timeline.forward_started()
    sim.run(compute, 5)
    work = collective(Tensor(), "dp", async_op=True)
    sim.run(compute, 4)  # 4 ms of compute overlap the 12-ms all-reduce
    wait(work)
    timeline.forward_done()
    optimizer_step(sim, timeline)
    sim.advance(1000)

    harvest = timeline.harvest()
    ((kind, group, in_flight, exposed),) = harvest.collectives
    assert (kind, group) == ("all_reduce", "dp")
    assert in_flight == pytest.approx(12 * MS) and exposed == pytest.approx(8 * MS)
    (step,) = harvest.steps
    assert step.exposed_s == pytest.approx(8 * MS) and step.forward_s == pytest.approx(9 * MS)
    assert [r[:3] for r in tap.records] == [("all_reduce", "dp", 4096)]  # the tap still counts it, with its bytes
    counts = tap.numbers["dp"]  # its group's count: issued, and done with on the host once queued
    assert (counts.issued, counts.completed, counts.kind, counts.nbytes) == (1, 1, "all_reduce", 4096)


class AsyncCollectiveTensor:
    """What a functional collective returns: its tensor, waited for with ``wait_tensor(result.elem)``."""

    def __init__(self) -> None:
        self.elem = Tensor()


def test_a_functional_collectives_wait_is_matched_to_the_collective_that_made_its_tensor() -> None:
    """Waited in another order than issued, and one wait for a tensor the tap saw no collective make: each wait's
    time goes to its own collective, and the stranger's takes nothing."""
    sim = SimCuda()
    timeline = timeline_on(sim)
    tap = cuda_tap(sim, timeline)
    compute, nccl = sim.default[MODEL_GPU], sim.Stream(MODEL_GPU)
    done: dict[int, SimEvent] = {}

    def issue(tensor: Tensor, group: Any, ms: float) -> AsyncCollectiveTensor:
        issued = sim.Event()
        issued.record(sim.current_stream(MODEL_GPU))
        issued.wait(nccl)
        sim.run(nccl, ms)
        result = AsyncCollectiveTensor()
        done[id(result.elem)] = sim.Event()
        done[id(result.elem)].record(nccl)
        return result

    def wait_tensor(tensor: Tensor) -> Tensor:
        if id(tensor) in done:
            sim.current_stream(MODEL_GPU).wait_event(done[id(tensor)])
        return tensor

    functional = collective_cuda.wrap_functional(tap, issue, issue, "all_gather", Where("tensor", 0, 1))
    wait = collective_cuda.wrap_wait_tensor(tap, wait_tensor, wait_tensor)
    timeline.forward_started()
    first, second = functional(Tensor(), "tp", 3), functional(Tensor(), "dp", 10)  # dp's done 13 ms from now
    wait(Tensor())  # no collective's: nothing timed
    wait(second.elem)  # 13 ms exposed
    sim.run(compute, 2)
    wait(first.elem)  # long done: 0 ms
    timeline.forward_done()
    optimizer_step(sim, timeline)
    sim.advance(1000)

    exposed = {group: wait_s for _, group, _, wait_s in timeline.harvest().collectives}
    assert exposed == pytest.approx({"dp": 13 * MS, "tp": 0.0})
    assert tap.cuda_functional == {}


def test_a_blocking_collective_on_the_compute_stream_is_in_flight_and_exposed_all_along() -> None:
    sim = SimCuda()
    timeline = timeline_on(sim)
    tap = cuda_tap(sim, timeline)
    compute = sim.default[MODEL_GPU]

    def all_reduce(tensor: Tensor, group: Any = None) -> None:
        sim.run(sim.current_stream(MODEL_GPU), 3)  # NCCL runs a blocking collective on the current stream

    collective = collective_cuda.wrap_collective(tap, all_reduce, all_reduce, "all_reduce", Where("tensor", 0, 1))
    train_step(sim, timeline, 1, 1, 1)
    timeline.forward_started()
    sim.run(compute, 2)
    timeline.forward_done()
    sim.run(compute, 5)
    collective(Tensor())  # the loss averaged for the log, inside the step
    optimizer_step(sim, timeline)
    sim.advance(1000)

    harvest = timeline.harvest()
    ((kind, group, in_flight, exposed),) = harvest.collectives
    assert (kind, group) == ("all_reduce", None)
    assert in_flight == pytest.approx(3 * MS) and exposed == pytest.approx(3 * MS)
    (step,) = harvest.steps
    assert step.backward_s == pytest.approx(5 * MS) and step.exposed_s == pytest.approx(3 * MS)
    fields = phase_fields(harvest, lambda group: "world")
    assert fields["comm_s"] == pytest.approx(3 * MS) and fields["overlap_s"] == pytest.approx(0.0)
    (row,) = fields["collectives"]
    assert (row.kind, row.group, row.calls, row.busy_s, row.exposed_s) == (
        "all_reduce", "world", 0, pytest.approx(3 * MS), pytest.approx(3 * MS)
    )  # fmt: skip


def test_an_optimizer_closure_is_forward_and_backward_not_the_optimizers() -> None:
    """Lightning runs forward and backward inside ``optimizer.step(closure)``."""
    sim = SimCuda()
    timeline = timeline_on(sim)
    compute = sim.default[MODEL_GPU]
    for _ in range(2):
        timeline.optimizer_started()
        timeline.closure_started()
        timeline.forward_started()
        sim.run(compute, 6)
        timeline.forward_done()
        sim.run(compute, 9)
        timeline.closure_done()
        sim.run(compute, 2)
        timeline.record_step()
        timeline.optimizer_done()
    sim.advance(1000)
    (step,) = timeline.harvest().steps
    assert (step.forward_s, step.backward_s, step.optimizer_s) == pytest.approx((6 * MS, 9 * MS, 2 * MS))


def test_steps_are_numbered_as_the_reporter_counts_them_and_a_window_keeps_their_work() -> None:
    sim = SimCuda()
    timeline = timeline_on(sim, first_step=41)  # watched after 40 steps had been marked
    for _ in range(3):
        train_step(sim, timeline, 1, 2, 1)
    sim.advance(1000)
    harvest = timeline.harvest()
    assert [s.number for s in harvest.steps] == [42, 43]
    fields = phase_fields(harvest, lambda group: "world")
    if {"work_step_numbers", "work_s"} <= set(Window.__struct_fields__):
        assert fields["work_step_numbers"] == (42, 43) and fields["work_s"] == pytest.approx((4 * MS, 4 * MS))
    else:  # the protocol does not carry them yet: nothing is sent that a Window would refuse
        assert "work_s" not in fields
    Window(run_id="r", rank=0, seq=1, t0=0.0, t1=1.0, **{k: v for k, v in fields.items() if k != "collectives"})


def test_a_step_without_a_training_forward_has_no_phases() -> None:
    sim = SimCuda()
    timeline = timeline_on(sim)
    compute = sim.default[MODEL_GPU]
    for _ in range(3):  # the hooks are on a module that does not run (another model trains)
        sim.run(compute, 5)
        timeline.record_step()
    sim.advance(1000)
    harvest = timeline.harvest()
    assert [s.step_s for s in harvest.steps] == pytest.approx([5 * MS, 5 * MS])
    assert all(s.forward_s is None for s in harvest.steps)
    fields = phase_fields(harvest, lambda group: "world")
    assert "forward_s" not in fields and "phases_from" not in fields  # N/A, not 0


def test_every_cuda_call_is_made_with_the_models_device_current_and_every_event_dropped_there() -> None:
    """Training on a thread that never chose a device (device 0 current), the model on GPU 3; the reporter
    reads on a thread of its own; at exit every event is dropped there, with GPU 3 current."""
    sim = SimCuda()
    device = RankCuda(MODEL_GPU, sim)
    made: list[CudaTimeline] = []
    side = sim.Stream(MODEL_GPU)
    done = sim.Event()  # the script's own event (FSDP2's), made here and kept to the end

    def training() -> None:
        timeline = CudaTimeline(device)
        tap = cuda_tap(sim, timeline)
        wait_event = collective_cuda.wrap_wait_event(tap, SimStream.wait_event)
        made.append(timeline)
        for _ in range(20):
            train_step(sim, timeline, 2, 3, 1)
            with sim.device(MODEL_GPU):  # the script's own calls, as torch makes them (on the tensors' device)
                sim.run(side, 1)
                done.record(side)
                compute = sim.current_stream(MODEL_GPU)
            with tap.waits_for("all_gather", None):
                wait_event(compute, done)  # FSDP2's wait: ours around it must still be on GPU 3

    def reporter(stop: threading.Event) -> None:
        while not stop.is_set():
            if made:
                made[0].harvest()
            sim.advance(5)
            stop.wait(0.001)
        sim.advance(1000)
        made[0].harvest()
        device.release()  # at exit, on the reporter thread

    trainer = threading.Thread(target=training, name="training")
    stop = threading.Event()
    reader = threading.Thread(target=reporter, args=(stop,), name="gputop-reporter")
    reader.start()
    trainer.start()
    trainer.join(30)
    stop.set()
    reader.join(30)
    made.clear()
    gc.collect()

    ours = [c for c in sim.calls if c.thread != "MainThread" and c.what != "wait"]  # "wait": the script's own call
    assert ours and [c for c in ours if c.current != MODEL_GPU] == []  # none of ours with another device current
    assert {c.device for c in sim.of("record")} == {MODEL_GPU}  # every event on GPU 3's streams
    assert {c.thread for c in sim.of("query", "elapsed_time")} == {"gputop-reporter"}
    events_made = [c for c in sim.of("Event") if c.thread == "training"]
    destroyed = [c for c in sim.of("destroy") if c.thread == "gputop-reporter"]
    assert len(destroyed) == len(events_made) > 20  # every event the training thread made, dropped by the reporter's
    assert [c.thread for c in sim.of("destroy")] == ["gputop-reporter"] * len(destroyed)  # and no other thread


def test_nccl_timing_is_read_from_the_processs_own_settings() -> None:
    assert nccl_timing_on({"TORCH_NCCL_ENABLE_TIMING": "1"})
    assert nccl_timing_on({"TORCH_NCCL_DESYNC_DEBUG": "true"})
    assert not nccl_timing_on({"TORCH_NCCL_ENABLE_TIMING": "0"}) and not nccl_timing_on({})


class TimedWork(Work):
    """An NCCL work under TORCH_NCCL_ENABLE_TIMING: its own duration once complete; dropped with a device current."""

    def __init__(self, sim: SimCuda, done: SimEvent, duration_ms: float, error: str | None = None) -> None:
        super().__init__(sim, done)
        self.duration_ms, self.error = duration_ms, error

    def is_completed(self) -> bool:
        return self.done.query()

    def _get_duration(self) -> float:
        if self.error is not None:
            raise RuntimeError(self.error)
        return self.duration_ms

    def __del__(self) -> None:
        self.sim.log("work destroyed", MODEL_GPU)


def test_nccls_own_durations_are_read_once_complete_for_a_few_works_and_the_rest_from_issue_to_wait() -> None:
    sim = SimCuda()
    timeline = timeline_on(sim, nccl_timing=True)
    tap = cuda_tap(sim, timeline)
    nccl = sim.Stream(MODEL_GPU)

    def all_reduce(tensor: Tensor, group: Any = None, async_op: bool = False) -> TimedWork:
        issued = sim.Event()
        issued.record(sim.current_stream(MODEL_GPU))
        issued.wait(nccl)
        sim.run(nccl, 2)
        done = sim.Event()
        done.record(nccl)
        return TimedWork(sim, done, duration_ms=1.5)  # NCCL's kernel alone, without the wait for its stream

    collective = collective_cuda.wrap_collective(tap, all_reduce, all_reduce, "all_reduce", Where("tensor", 0, 1))
    wait = collective_cuda.wrap_wait(tap, Work.wait, Work.wait)
    for _ in range(20):
        wait(collective(Tensor(), "dp", async_op=True))
    assert len(timeline._works) == 16 and timeline.untimed_works == 4  # the rest: issue to wait, on the GPU clock
    assert timeline.harvest().collectives == []  # none complete yet: no duration asked of an incomplete work

    sim.advance(1000)
    ((kind, group, in_flight, exposed),) = timeline.harvest().collectives
    assert (kind, group) == ("all_reduce", "dp")
    assert in_flight == pytest.approx((16 * 1.5 + 4 * 2) * MS) and exposed == pytest.approx(20 * 2 * MS)
    gc.collect()
    # The 16 held were dropped by the harvest, with GPU 3 current; the 4 others when the script let go of them.
    assert sorted(c.current for c in sim.of("work destroyed")) == [0] * 4 + [MODEL_GPU] * 16


def test_a_process_whose_nccl_does_not_time_says_so_and_times_from_issue_to_wait() -> None:
    sim = SimCuda()
    timeline = timeline_on(sim, nccl_timing=True)
    tap = cuda_tap(sim, timeline)
    nccl = sim.Stream(MODEL_GPU)

    def all_reduce(tensor: Tensor, group: Any = None, async_op: bool = False) -> TimedWork:
        sim.run(nccl, 2)
        done = sim.Event()
        done.record(nccl)
        return TimedWork(sim, done, 0.0, error="getDuration only works if timing was enabled")

    collective = collective_cuda.wrap_collective(tap, all_reduce, all_reduce, "all_reduce", Where("tensor", 0, 1))
    wait = collective_cuda.wrap_wait(tap, Work.wait, Work.wait)
    wait(collective(Tensor(), "dp", async_op=True))
    sim.advance(1000)
    timeline.harvest()
    assert not timeline.nccl_timing and "timing was enabled" in (timeline.why_not() or "")
    wait(collective(Tensor(), "dp", async_op=True))  # from now on: issue to the wait's end
    sim.advance(1000)
    ((_, _, in_flight, _),) = timeline.harvest().collectives
    assert in_flight == pytest.approx(2 * MS)


def test_nothing_is_recorded_while_a_cuda_graph_is_being_captured() -> None:
    """An event recorded on a capturing stream would be part of the graph, never readable by the reporter."""
    sim = SimCuda()
    timeline = timeline_on(sim)
    train_step(sim, timeline, 1, 1, 1)
    with sim.capture(sim.Stream(MODEL_GPU)):
        timeline.forward_started()
        timeline.forward_done()
        assert timeline.begin() == 0
    for _ in range(2):
        train_step(sim, timeline, 2, 3, 1)
    sim.advance(1000)
    steps = timeline.harvest().steps
    assert [s.forward_s for s in steps] == pytest.approx([2 * MS, 2 * MS]) and timeline.errors == 0


def test_the_reporters_reads_never_break_a_graph_another_thread_captures_in_global_mode() -> None:
    """``torch.cuda.graph`` captures in global mode by default, where an event query from another thread in the
    default interaction mode invalidates the capture: the reporter thread reads in thread-local mode."""
    sim = SimCuda()
    timeline = timeline_on(sim)
    for _ in range(3):
        train_step(sim, timeline, 2, 3, 1)
    sim.advance(1000)
    harvested: list[Any] = []

    def reporter_thread() -> None:
        harvested.append(timeline.harvest())
        harvested.append(timeline._device.step_times_s())

    with sim.capture(sim.Stream(MODEL_GPU)):  # the training thread captures a graph meanwhile
        reader = threading.Thread(target=reporter_thread, name="gputop-reporter")
        reader.start()
        reader.join()
    assert sim.invalidated == [], sim.invalidated
    assert [s.forward_s for s in harvested[0].steps] == pytest.approx([2 * MS, 2 * MS])
    assert harvested[1] == pytest.approx([6 * MS, 6 * MS])
    assert sim.exchange_capture_mode(0) == 0  # the training thread's own mode was never touched


def test_a_step_marked_inside_a_capture_is_not_recorded_and_the_steps_after_it_still_read() -> None:
    """An event recorded on the capturing stream is a node of the graph: it never completes, and at the head of
    the queue it would keep every later step from being read."""
    sim = SimCuda()
    device = RankCuda(MODEL_GPU, sim)
    compute = sim.default[MODEL_GPU]
    device.record_step()
    with sim.capture(sim.Stream(MODEL_GPU)), sim.device(MODEL_GPU):
        device.record_step()  # a step that ends inside the captured region (torch.cuda.graph around the step)
    for _ in range(2):
        sim.run(compute, 4)
        device.record_step()
    sim.advance(1000)
    assert device.step_times_s() == pytest.approx([4 * MS, 4 * MS])


def test_under_one_hardware_queue_no_event_goes_on_a_communication_stream_and_the_wait_is_still_exposed() -> None:
    """CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron, Transformer Engine): an event recorded between collectives on their
    stream costs their overlap with compute (pytorch #143890).  None goes there; the wait is timed on the compute
    stream, and the time in flight says why it is N/A."""
    sim = SimCuda()
    timeline = timeline_on(sim, single_queue=True)
    tap = cuda_tap(sim, timeline)
    compute, side = sim.default[MODEL_GPU], sim.Stream(MODEL_GPU)

    def all_gather(tensor: Any, group: Any = None, async_op: bool = False) -> Work:
        sim.run(side, 9)  # FSDP2 issues its all-gathers on a stream of its own: done at 9 ms, compute at 5
        done = sim.Event()
        done.record(side)
        return Work(sim, done)

    collective = collective_cuda.wrap_collective(tap, all_gather, all_gather, "all_gather", Where("tensor", 0, 1))
    wait = collective_cuda.wrap_wait(tap, Work.wait, Work.wait)
    train_step(sim, timeline, 1, 1, 1)
    timeline.forward_started()
    with sim.stream(side):
        work = collective(Tensor(), "dp", async_op=True)
    sim.run(compute, 2)
    wait(work)
    timeline.forward_done()
    optimizer_step(sim, timeline)
    sim.advance(1000)
    assert len(side.ops) == 2  # the collective's own kernel and its completion event: nothing of gputop's
    ((kind, _, in_flight, exposed),) = timeline.harvest().collectives
    assert kind == "all_gather" and exposed == pytest.approx(4 * MS) and in_flight is None, (in_flight, exposed)
    assert "CUDA_DEVICE_MAX_CONNECTIONS=1" in (timeline.why_not() or "")


class _IllegalWork:
    """What every collective inside torch's ``_coalescing_manager`` returns: thrown away, never waited."""


def test_discarded_and_id_reused_works_give_their_events_back_and_the_pool_adds_up() -> None:
    """Works kept by ``id()``: a coalesced collective's throwaway work, and a work dropped unwaited whose id the
    next one reuses, each stranded an issue event for good; after 16,384 the pool was dry for the rest of the run."""
    sim = SimCuda()
    timeline = timeline_on(sim, pool_events=64)
    tap = cuda_tap(sim, timeline)
    same_id = Work(sim, sim.Event())  # a work dropped unwaited, and the next one made where it was: the same id

    def coalesced(tensor: Any, group: Any = None, async_op: bool = False) -> Any:
        return _IllegalWork()

    def unwaited(tensor: Any, group: Any = None, async_op: bool = False) -> Any:
        return same_id

    where = Where("tensor", 0, 1)
    in_manager = collective_cuda.wrap_collective(tap, coalesced, coalesced, "all_gather", where)
    dropped = collective_cuda.wrap_collective(tap, unwaited, unwaited, "all_reduce", where)
    wait = collective_cuda.wrap_wait(tap, Work.wait, Work.wait)
    for _ in range(200):  # three pools' worth of issue events
        train_step(sim, timeline, 1, 1, 1)
        in_manager(Tensor(), "dp", async_op=True)
        dropped(Tensor(), "dp", async_op=True)
        sim.advance(10)
        timeline.harvest()
    wait(dropped(Tensor(), "dp", async_op=True))
    sim.advance(1000)
    timeline.harvest()
    counts = timeline.accounting()
    assert sum(counts.values()) == 64, counts
    assert counts["open"] <= len(tap.cuda_pending) <= 1 and timeline.lost_steps == 0, (counts, timeline.lost_steps)


def test_a_batch_of_sends_coalesced_into_one_work_is_in_flight_until_its_wait_and_exposed_for_it() -> None:
    """Pipeline parallelism's ``batch_isend_irecv`` on NCCL: each isend inside hands back a throwaway; the batch is
    one work, waited by the script.  It read about 0 exposed, its events stranded."""
    sim = SimCuda()
    timeline = timeline_on(sim)
    tap = cuda_tap(sim, timeline)
    compute, nccl = sim.default[MODEL_GPU], sim.Stream(MODEL_GPU)

    def isend(tensor: Any, group: Any = None) -> Any:
        return _IllegalWork()

    def batch_isend_irecv(ops: list[Any]) -> list[Work]:  # torch's, under _coalescing_manager
        for op in ops:
            op.op(op.tensor, group=op.group)
        issued = sim.Event()
        issued.record(compute)
        issued.wait(nccl)
        sim.run(nccl, 10)
        done = sim.Event()
        done.record(nccl)
        return [Work(sim, done)]

    send = collective_cuda.wrap_collective(tap, isend, isend, "send", Where("tensor", 0, 1))
    batched = collective_cuda.wrap_batch_p2p(tap, batch_isend_irecv)
    wait = collective_cuda.wrap_wait(tap, Work.wait, Work.wait)
    timeline.forward_started()
    sim.run(compute, 2)
    works = batched([SimpleNamespace(op=send, tensor=Tensor(), group="pp") for _ in range(2)])
    sim.run(compute, 3)  # 3 ms of the stage's own work beside the 10-ms exchange
    for work in works:
        wait(work)
    timeline.forward_done()
    optimizer_step(sim, timeline)
    sim.advance(1000)

    ((kind, group, in_flight, exposed),) = timeline.harvest().collectives
    assert (kind, group) == ("send", "pp")
    assert in_flight == pytest.approx(10 * MS) and exposed == pytest.approx(7 * MS)
    assert [r[:3] for r in tap.records] == [("send", "pp", 4096)] * 2  # each send still counted, with its bytes
    counts = timeline.accounting()
    assert counts["open"] == counts["pending"] == 0 and not tap.cuda_pending, counts


class Group:
    def __init__(self, ranks: int) -> None:
        self.ranks = ranks

    def size(self) -> int:
        return self.ranks


class ParamGroup:
    """What the scope reads of FSDP2's FSDPParamGroup: its process group for the kind of wait."""

    def __init__(self, ranks: int) -> None:
        self._all_gather_process_group = Group(ranks)


def test_fsdp2s_waits_are_scoped_to_their_kind_and_group_and_a_one_rank_group_is_left_untimed() -> None:
    sim = SimCuda()
    tap = cuda_tap(sim, timeline_on(sim))
    seen: list[Any] = []
    wait_for_unshard = collective_cuda.wrap_fsdp_scope(
        tap, lambda param_group: seen.append(tap.wait_scope), "all_gather"
    )
    sharded, alone = ParamGroup(8), ParamGroup(1)
    wait_for_unshard(sharded)
    wait_for_unshard(alone)  # FSDP2 copies instead of all-gathering: its waits are no communication
    tap.on = False
    wait_for_unshard(sharded)  # no collector: straight through
    assert seen == [("all_gather", sharded._all_gather_process_group, sharded), ("all_gather", None, alone), None]
    assert tap.wait_scope is None
    wait_event = collective_cuda.wrap_wait_event(tap, SimStream.wait_event)
    tap.on = True
    with tap.waits_for("all_gather", None, alone):
        wait_event(sim.default[MODEL_GPU], sim.Event())
    assert tap.timeline is not None and not tap.timeline._pending  # the one-rank group's wait: untimed


class HsdpParamGroup:
    """What the scope reads of an HSDP FSDPParamGroup: its three groups and the events of its collectives."""

    def __init__(self, sim: SimCuda) -> None:
        self._all_gather_process_group = self._reduce_scatter_process_group = Group(4)
        self._all_reduce_process_group = Group(2)  # across the replicas
        self._post_reduce_event, self._all_reduce_state = sim.Event(), SimpleNamespace(event=sim.Event())
        self._all_gather_result: Any = SimpleNamespace(all_gather_event=sim.Event())  # prefetched, never used


def test_each_wait_at_fsdp2s_backward_end_is_booked_as_the_collective_its_event_is_of(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch 2.13's end of backward: the root's final callback runs each group's ``finalize_backward`` (the leftover
    all-gather waited through ``torch.accelerator``'s stream, a C type that cannot be wrapped; the reduce-scatter;
    HSDP's all-reduce), then waits for the last reduce-scatter still in flight itself."""
    sim = SimCuda()
    timeline = timeline_on(sim)
    tap = cuda_tap(sim, timeline)
    plain_wait = SimStream.wait_event
    monkeypatch.setattr(SimStream, "wait_event", collective_cuda.wrap_wait_event(tap, plain_wait))  # torch.cuda's

    class CStream:  # torch.Stream, what torch.accelerator.current_stream() returns
        def __init__(self, stream: SimStream) -> None:
            self.stream = stream

        def wait_event(self, event: SimEvent) -> None:
            plain_wait(self.stream, event)

    accelerator_stream = collective_cuda.wrap_accelerator_stream(
        tap, lambda device=None: CStream(sim.current_stream(device)), sim.current_stream
    )
    param_group = HsdpParamGroup(sim)
    root = SimpleNamespace(_fsdp_param_groups=[], _state_ctx=SimpleNamespace(all_states=[]), last=sim.Event())
    root._state_ctx.all_states = [root, SimpleNamespace(_fsdp_param_groups=[param_group])]

    def finalize_backward(param_group: HsdpParamGroup) -> None:
        accelerator_stream().wait_event(param_group._all_gather_result.all_gather_event)
        sim.current_stream().wait_event(param_group._post_reduce_event)  # device_handle.current_stream()
        sim.current_stream().wait_event(param_group._all_reduce_state.event)

    finalize = collective_cuda.wrap_fsdp_scope(tap, finalize_backward, "reduce_scatter")

    def final_callback(root: Any) -> None:
        finalize(param_group)
        sim.current_stream().wait_event(root.last)

    callback = collective_cuda.wrap_fsdp_scope(tap, final_callback, "reduce_scatter")
    compute, side = sim.default[MODEL_GPU], sim.Stream(MODEL_GPU)
    with sim.device(MODEL_GPU):  # FSDP2's current device is the model's
        timeline.forward_started()
        sim.run(compute, 4)
        timeline.forward_done()
        issued = sim.Event()
        issued.record(compute)
        side.wait_event(issued)
        for ms, event in ((3, param_group._all_gather_result.all_gather_event), (5, param_group._post_reduce_event),
                          (2, param_group._all_reduce_state.event), (4, root.last)):  # fmt: skip
            sim.run(side, ms)
            event.record(side)
        sim.run(compute, 1)  # 1 ms of the compute stream's own: the all-gather's first ms hidden
        callback(root)
        assert isinstance(accelerator_stream(), CStream)  # outside FSDP2's methods: torch's own
        optimizer_step(sim, timeline)
    sim.advance(1000)
    exposed = {(kind, group): wait for kind, group, _, wait in timeline.harvest().collectives}

    assert exposed == pytest.approx({
        ("all_gather", param_group._all_gather_process_group): 2 * MS,
        ("reduce_scatter", param_group._reduce_scatter_process_group): 9 * MS,
        ("all_reduce", param_group._all_reduce_process_group): 2 * MS,
    })  # fmt: skip
    assert tap.wait_scope is None


def test_the_tap_finds_fsdp2s_methods_and_stream_wait_event_and_puts_them_back() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("torch.distributed.fsdp")
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    originals = {name: getattr(FSDPParamGroup, name) for name in ("wait_for_unshard", "post_backward",
                                                                   "finalize_backward")}  # fmt: skip
    callback = FSDPState._root_post_backward_final_callback
    batch = torch.distributed.batch_isend_irecv
    wait_event, accelerator_stream = torch.cuda.Stream.wait_event, torch.accelerator.current_stream
    tap = cuda_tap(SimCuda(), timeline_on(SimCuda()))
    wrapped = tap.install()
    try:
        assert {"FSDPParamGroup.wait_for_unshard", "FSDPParamGroup.post_backward", "FSDPParamGroup.finalize_backward",
                "FSDPState._root_post_backward_final_callback", "Stream.wait_event", "accelerator.current_stream",
                "Work.wait", "batch_isend_irecv"} <= set(wrapped)  # fmt: skip
        assert torch.distributed.batch_isend_irecv.__gputop_original__ is batch
        assert getattr(FSDPState._root_post_backward_final_callback, "__gputop_original__", None) is callback
        assert torch.cuda.Stream.wait_event.__gputop_original__ is wait_event
        assert torch.accelerator.current_stream.__gputop_original__ is accelerator_stream
        assert all(getattr(FSDPParamGroup, n).__gputop_original__ is f for n, f in originals.items())
    finally:
        tap.uninstall()
    assert torch.cuda.Stream.wait_event is wait_event and torch.accelerator.current_stream is accelerator_stream
    assert all(getattr(FSDPParamGroup, n) is f for n, f in originals.items())
    assert FSDPState._root_post_backward_final_callback is callback and torch.distributed.batch_isend_irecv is batch


def test_the_cuda_runtime_is_the_one_the_process_mapped_and_never_loaded_anew(tmp_path: Any) -> None:
    from gputop.reporter.capture_mode import _loaded_cudart

    maps = tmp_path / "maps"
    maps.write_text(
        "7f1c-7f2c r-xp 00000000 fd:01 123 /usr/lib/libc.so.6\n"
        "7f3c-7f4c r-xp 00000000 fd:01 456 /venv/lib/nvidia/cu13/lib/libcudart.so.13\n"
    )
    assert _loaded_cudart(str(maps)) == "/venv/lib/nvidia/cu13/lib/libcudart.so.13"
    maps.write_text("7f1c-7f2c r-xp 00000000 fd:01 123 /usr/lib/libc.so.6\n")
    assert _loaded_cudart(str(maps)) is None
    assert _loaded_cudart(str(tmp_path / "gone")) is None
