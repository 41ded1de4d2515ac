"""A step's phases and the communication waits in it, on the GPU's own clock: CUDA events from a bounded pool.

On CUDA the training thread only queues work: a forward's pre- and post-hook, the optimizer's hooks and the
step mark fire when the kernels are launched, not when they run, so the CPU path's phases (``clock.py``)
would time launches and call them forward and backward.  Here the same marks put a CUDA event on the model
device's current stream instead; the GPU timestamps each event when it reaches it, and the reporter thread
reads the events once they have completed (``query()``, never a synchronisation, never ``elapsed_time`` on an
event that has not completed: ``timeline_reader.py``, this object's reporter-thread half).  A step on the GPU
clock is then: forward (the sum of the forward spans), backward (a forward's end to the next forward or the
optimizer), the optimizer, the step (mark to mark), and the exposed communication, each span less the exposed
communication inside it, as ``clock.py`` does on CPU.

Exposed communication is the time the compute stream sat idle waiting for a collective: an event on the
stream just before the wait and one just after it, with nothing else queued between them, so their
difference is the wait itself.  The waits are wherever the compute stream is made to wait: FSDP2's
``current_stream().wait_event(...)`` before a block's forward and backward (all-gather) and before the
optimizer (reduce-scatter), ``Work.wait()`` on a CUDA work, DTensor's ``wait_tensor``, and a blocking
collective issued on the compute stream (the collective tap, ``collectives.py``, calls ``begin`` and ``end_*``
around them).  A collective issued on a side stream is timed there too, from issue to completion: its time in
flight, of which only the waits were exposed.

Events come from a pool of at most ``POOL_EVENTS``, reused once the reporter thread has read them: a GPU that
stops completing events (a hung kernel) lets the pool run dry, and then the training thread stops recording,
the steps it could not record are N/A and counted, and nothing grows.  Every CUDA call is made with the
model's device current (``RankCuda``'s discipline: a thread that never chose a device would make a context on
GPU 0), and events are dropped only in that scope, on the reporter thread: the training thread never lets
go of one (an event is only ever held by this object's own containers).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from gputop.reporter.cuda_switches import ONE_CONNECTION, one_connection
from gputop.reporter.rank_cuda import RankCuda
from gputop.reporter.timeline_reader import (
    BLOCKING,
    CLOSURE_END,
    CLOSURE_START,
    FORWARD_END,
    FORWARD_START,
    LOST,
    OPTIMIZER_END,
    OPTIMIZER_START,
    STEP,
    WAIT,
    Harvest,
    TimelineReader,
)

# Events in flight at most: a window's marks stay pending until the reporter thread reads them, once a window,
# and a GPU runs a step or two behind.  A 64-block FSDP2 model makes ~260 marks a step (two per wait, two per
# collective, a few phases); at 20 steps/s that is ~5,000 a window, and the pool holds three windows of them.
POOL_EVENTS = 1 << 14
# After running dry, recording resumes at a step mark once this share of the pool is free again, so a pool
# that keeps running dry does not flap every step.
RESUME_SHARE = 0.5
# NCCL works held for their duration (``Work._get_duration``) until they complete: each holds its output
# tensors, so only a few are kept, and only for a window.
MAX_TIMED_WORKS = 16


class CudaTimeline:
    """The rank's phase and wait events on its one GPU, recorded by the training thread, read by the reporter's.

    ``device`` is the ``RankCuda`` of the model's GPU: its ``cuda`` (``torch.cuda`` or a stand-in), its index,
    its step events (``record_step`` records those too, so this object is the clock's ``gpu_steps``), and its
    release at exit, which drops these events as well.  ``first_step``: the number the next step mark ends.
    """

    def __init__(
        self,
        device: RankCuda,
        *,
        first_step: int = 1,
        pool_events: int = POOL_EVENTS,
        nccl_timing: bool = False,
        single_queue: bool | None = None,
    ) -> None:
        """``single_queue``: CUDA_DEVICE_MAX_CONNECTIONS=1 (None: read from the environment), where no event is
        recorded on a stream other than the compute stream (``ONE_CONNECTION``)."""
        self._device = device
        self._cuda = device.cuda
        # A CUDA graph being captured on the stream takes no mark: an event recorded there is part of the graph,
        # and the reporter thread could never read it.
        self._capturing = getattr(self._cuda, "is_current_stream_capturing", bool)
        self.index = device.index
        self.pool_events = pool_events
        self.resume_free = max(int(pool_events * RESUME_SHARE), 1)
        self.nccl_timing = nccl_timing  # harvest NCCL's own durations of asynchronous works
        self.single_queue = one_connection() if single_queue is None else single_queue
        self.untimed_side = 0  # collectives issued on a side stream left untimed (``single_queue``)
        # -- the training thread's (and the autograd engine's, which runs backward hooks) --
        self._free: deque[Any] = deque()  # events read and given back by the reporter thread
        self._made = 0  # events made so far, at most pool_events
        self._pending: deque[tuple[Any, ...]] = deque()  # marks and pairs, in the order they were recorded
        self._open: dict[int, tuple[Any, Any]] = {}  # key: (event, stream) recorded before a call, until after it
        self._keys = 0
        self._taken: Any = None  # the event being recorded (``_take``)
        self._works: deque[tuple[Any, str, Any]] = deque()  # (NCCL work, kind, group) until it completes
        self._dry = False  # the pool ran dry: nothing is recorded until it refills, at a step mark
        self._broken = False  # the step in progress lost a mark: it is N/A
        self._closed = False  # released, or a CUDA call failed: nothing more is recorded
        self._step = first_step - 1  # the number of the last step marked
        self.optimizer_depth = 0
        self._optimizer_ended_by_step = False  # the step mark came inside the optimizer's step (its post-hook)
        self._compute: Any = None  # the stream the training forward runs on: waits there are exposed
        self.errors = 0  # CUDA calls that failed (the first one's words in ``failure``)
        self.failure: str | None = None
        self.lost_steps = 0  # steps N/A because a mark could not be recorded (the pool was dry)
        self.untimed_works = 0  # works not held for their duration (too many in flight)
        self.missing: list[str] = []  # waits this torch offers no hook for (the collective tap says which)
        # -- the reporter thread's: reading the events once they have completed --
        self._reader = TimelineReader(self._pending, self._free, self._works)
        device.on_release(self._drop_events)
        self._remember_compute_stream()

    # -- the training thread: marks ------------------------------------------------------------------

    def record_step(self) -> None:
        """The step mark (``clock.StepClock.mark_step``): the GPU step event, and this step's end on the timeline.

        A failure of the step event itself propagates (the clock turns GPU events off and counts it).
        """
        try:
            self._device.record_step()
        except Exception:
            self._closed = True
            raise
        self._step += 1
        if self.optimizer_depth:  # the primary optimizer's post-hook marks the step before ours ends its span
            self._optimizer_ended_by_step = True
        if self._closed:
            return
        if self._broken:
            self.lost_steps += 1
        if self._dry:
            if len(self._free) + self.pool_events - self._made < self.resume_free:
                return
            self._dry = False
        self._broken = False
        self._mark(STEP, self._step)
        if self._dry:  # this very mark found the pool dry: the step it ends is lost too
            self.lost_steps += 1

    def forward_started(self) -> None:
        """A training forward of the watched model begins (its pre-hook)."""
        self._mark(FORWARD_START, None, compute=True)

    def forward_done(self) -> None:
        self._mark(FORWARD_END)

    def optimizer_started(self) -> None:
        """An optimizer's step begins (a global pre-hook): the outermost one opens the optimizer's span."""
        self.optimizer_depth += 1
        if self.optimizer_depth == 1:
            self._optimizer_ended_by_step = False
            self._mark(OPTIMIZER_START)

    def optimizer_done(self) -> None:
        depth = self.optimizer_depth = max(self.optimizer_depth - 1, 0)
        if depth == 0 and not self._optimizer_ended_by_step:
            self._mark(OPTIMIZER_END)

    def closure_started(self) -> None:
        """The optimizer's closure runs forward and backward (Lightning): the optimizer's span pauses."""
        self._mark(CLOSURE_START)

    def closure_done(self) -> None:
        self._mark(CLOSURE_END)

    def _mark(self, code: int, number: int | None = None, *, compute: bool = False) -> None:
        if self._dry or self._closed:
            return
        cuda = self._cuda
        try:
            with cuda.device(self.index):
                if self._capturing():
                    return
                event = self._take()
                if event is None:
                    self._run_dry()
                    return
                stream = cuda.current_stream(self.index)  # the model's device's stream, not the thread's device's
                event.record(stream)
                self._taken = None
                if compute:
                    self._compute = stream
        except Exception as exc:
            self._fail(exc)
            return
        self._pending.append((code, event, number))

    def _take(self) -> Any:
        """A free event, or a new one while the pool has room; None when it is dry (in scope).

        The event stays in ``_taken`` until the caller has recorded it and put it somewhere: a record that
        fails leaves it there, and ``_fail`` puts it back in the pool rather than let the training thread drop it.
        """
        try:
            event = self._free.popleft()
        except IndexError:
            if self._made >= self.pool_events:
                return None
            self._made += 1
            event = self._cuda.Event(enable_timing=True)
        self._taken = event
        return event

    def _run_dry(self) -> None:
        self._dry = self._broken = True
        self._pending.append((LOST, None, None))

    def _fail(self, exc: Exception) -> None:
        if self._taken is not None:
            self._free.append(self._taken)
            self._taken = None
        self.errors += 1
        if self.failure is None:
            self.failure = f"{type(exc).__name__}: {exc}"[:200]
        self._closed = self._broken = True
        self._pending.append((LOST, None, None))

    def _remember_compute_stream(self) -> None:
        cuda = self._cuda
        try:
            with cuda.device(self.index):
                self._compute = cuda.current_stream(self.index)
        except Exception as exc:
            self._fail(exc)

    # -- the training thread: communication -----------------------------------------------------------

    def begin(self, stream: Any = None, *, compute_only: bool = False) -> int:
        """An event on ``stream`` (None: the device's current stream) before a call that waits or communicates.

        Returns a key for ``end_blocking`` / ``end_wait`` / ``abandon``, or 0 where nothing was recorded (the
        pool is dry, the timeline closed, or ``compute_only`` and the stream is not the compute stream).
        Never raises.
        """
        if self._dry or self._closed:
            return 0
        cuda = self._cuda
        try:
            with cuda.device(self.index):
                if self._capturing():
                    return 0
                if stream is None:
                    stream = cuda.current_stream(self.index)
                elif compute_only and stream != self._compute:
                    return 0
                if self.single_queue and stream != self._compute:
                    self.untimed_side += 1
                    return 0
                event = self._take()
                if event is None:
                    self._run_dry()
                    return 0
                event.record(stream)
                self._taken = None
                self._keys += 1
                key = self._keys
                self._open[key] = (event, stream)
        except Exception as exc:
            self._fail(exc)
            return 0
        return key

    def end_blocking(self, key: int, kind: str, group: Any) -> None:
        """After a blocking collective issued at ``begin(key)``: its time in flight on that stream, and exposed
        where that stream is the compute stream (it ran there, or the compute stream waited for it there)."""
        self._end(BLOCKING, key, 0, kind, group)

    def end_wait(self, key: int, kind: str, group: Any, issued: int = 0) -> None:
        """After a wait that began at ``begin(key)``: exposed where the compute stream waited; in flight from
        ``issued`` (the ``begin`` before the asynchronous collective was issued), when there was one."""
        self._end(WAIT, key, issued, kind, group)

    def abandon(self, key: int) -> None:
        """A ``begin`` whose call never ended as timed (it raised, or its wait never came): back to the pool."""
        opened = self._open.pop(key, None)
        if opened is not None:
            self._free.append(opened[0])

    def _end(self, code: int, key: int, issued_key: int, kind: str, group: Any) -> None:
        opened = self._open.pop(key, None) if key else None
        issued = self._open.pop(issued_key, None) if issued_key else None
        if opened is None:
            if issued is not None:
                self._free.append(issued[0])
            return
        before, stream = opened
        cuda = self._cuda
        after, on_compute = None, False
        try:
            with cuda.device(self.index):
                after = self._take()
                if after is not None:
                    after.record(stream)
                    self._taken = None
                    on_compute = bool(stream == self._compute)
        except Exception as exc:
            self._fail(exc)
            after = None
        if after is None:  # dry or failed: the step is N/A; the events go back to the pool, never dropped here
            self._free.append(before)
            if issued is not None:
                self._free.append(issued[0])
            if not self._closed:
                self._run_dry()
            return
        self._pending.append((code, before, after, None if issued is None else issued[0], kind, group, on_compute))

    def track_work(self, work: Any, kind: str, group: Any) -> bool:
        """Hold an asynchronous NCCL work until it completes, for NCCL's own duration of it: only where NCCL
        times its collectives, and only a few at once (each holds its tensors).  Whether it was taken: if not,
        its time in flight is from its issue to the end of its wait, on the GPU clock."""
        if not self.nccl_timing or self._closed:
            return False
        if len(self._works) >= MAX_TIMED_WORKS:
            self.untimed_works += 1
            return False
        self._works.append((work, kind, group))
        return True

    # -- the reporter thread ------------------------------------------------------------------------

    def harvest(self) -> Harvest:
        """The steps and waits whose events have all completed, oldest first; the rest wait for the next call.

        ``query()`` never waits, so the training thread is never synchronised; ``elapsed_time`` is asked only
        of completed events.  Each event read goes back to the pool.  With the model's device current.
        """
        harvest = self._device.reading(self._reader.read)
        if self._reader.work_timing_error is not None:
            self.nccl_timing = False  # NCCL does not time this process's collectives: hold no more works
        return harvest

    def why_not(self) -> str | None:
        """Why some phases or times are N/A, with nothing wrong in the probe; None when all were measured."""
        if self.failure is not None:
            return f"a CUDA event failed ({self.failure}); phases on the GPU clock are off"
        if self.lost_steps:
            return (
                f"some steps' phases are N/A: the GPU had not completed the {self.pool_events} CUDA events gputop "
                "keeps in flight (a stream that does not finish, or more marks a window than the pool holds)"
            )
        if self._reader.work_timing_error is not None:
            return f"NCCL's own collective durations are not available here ({self._reader.work_timing_error})"
        if self.untimed_side:
            return ONE_CONNECTION
        if self.missing:
            return "; ".join(self.missing)
        return None

    def accounting(self) -> dict[str, int]:
        """Where the pool's events are, adding up to ``pool_events``: ``free``, ``pending`` (recorded, not read),
        ``open`` (begun, not ended), ``held`` (the reader's anchor, the one being recorded), ``room`` (not made)."""
        pending = 0
        for entry in list(self._pending):
            if len(entry) == 3:  # a mark (LOST has no event)
                pending += entry[1] is not None
            else:  # a pair, and the event where it had one
                pending += 2 + (entry[3] is not None)
        held = (self._reader.anchor is not None) + (self._taken is not None)
        return {
            "free": len(self._free),
            "pending": pending,
            "open": len(self._open),
            "held": held,
            "room": self.pool_events - self._made,
        }

    # -- exit ---------------------------------------------------------------------------------------

    def close(self) -> None:
        """Record nothing more (a newer model is watched); the events stay until the release drops them."""
        self._closed = True

    def _drop_events(self) -> None:
        """Every event and work held, dropped (``RankCuda.release``, in scope on the reporter thread)."""
        self._closed = True
        self._taken = None
        self._free.clear()
        self._pending.clear()
        self._open.clear()
        self._works.clear()
        self._reader.drop()
