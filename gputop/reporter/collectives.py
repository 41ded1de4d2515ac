"""Every collective the training thread issues through torch.distributed's Python API, timed: the tap.

FSDP2, DeepSpeed's ``deepspeed.comm``, Accelerate and user code all reach the process group through
``torch.distributed.<collective>`` (looked up on the package at call time), and DTensor through the
functional collectives (``torch.distributed._functional_collectives``).  ``CollectiveTap.install``
puts a thin wrapper in those places, and around ``Work.wait()`` and the functional ``wait_tensor``,
where an asynchronous collective is waited for.  Which source serves which stack, and what stays N/A
where: docs/communication.md.

On the training thread a wrapper does memory work only: two ``perf_counter()`` reads, the first
tensor's size, a tuple appended to a deque (atomic under the GIL) or kept in a small dict until its
``wait()``.  Nothing is synchronised, nothing allocated on a device, no collective of gputop's own;
the user's own exceptions pass through untouched and a failure of gputop's bookkeeping is counted,
never raised.  While no collector listens (``on`` is False) a wrapper only calls through.  Under
``torch.compile`` the wrappers stand where the originals stood in dynamo's own table of collectives
it rewrites, so a compiled graph issues the same functional collectives as without gputop.

What "exposed" means here: on a CPU backend (gloo) a blocking collective, or the ``wait()`` of an
asynchronous one, holds the training thread for exactly as long as training cannot go on; that is
the exposed time, and issue-to-completion is the time in flight.  On CUDA both return once the work is
queued on a stream, so the host's clock measures nothing of the collective.  Where the model is on one
GPU and off DDP, the reporter gives the tap a ``CudaTimeline`` before installing it, and the wrappers
installed are then the CUDA ones (``collective_cuda.py``), timed by events on the GPU.  Without a timeline
(DDP, a model on several GPUs, ``GPUTOP_CUDA_EVENTS=0``) CUDA collectives are counted with their bytes and
their times are N/A (``not_measured`` says so).  Which functions are wrapped, and where their tensor and
group are: ``collective_calls.py``.

The reporter thread drains the records once a window (``gputop.reporter.probes.collectives``), names
each process group by its DeviceMesh dimension where it has one, and adds them up by kind and group.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from gputop.reporter import collective_cuda, collective_functional, compiled
from gputop.reporter.clock import StepClock
from gputop.reporter.collective_calls import (
    DIST_COLLECTIVES,
    FUNCTIONAL_COLLECTIVES,
    IMPORTED_AT,
    MAX_PENDING,
    WaitScope,
    Where,
    on_cpu,
    tensor_bytes,
)
from gputop.reporter.collective_digests import SiteDigests, record
from gputop.reporter.collective_numbers import GroupCounts, default_group
from gputop.reporter.cuda_timeline import CudaTimeline

# A record per collective: (kind, group, bytes, in flight s, exposed s, perf_counter when it returned); times None
# where not measured (CUDA).  The return time puts it in the window of the step it belongs to (``drain``).
Record = tuple[str, Any, int, "float | None", "float | None", float]
# An asynchronous collective until its wait: (kind, group, bytes, issued at, the issue call's own time, its group's
# counts, its number on the group); the counts and number None where it was not numbered.
Issued = tuple[str, Any, int, float, float, "GroupCounts | None", "int | None"]
# Records between two windows: at 64 collectives a step and 1,000 steps a second, a whole window.
MAX_RECORDS = 1 << 16


class CollectiveTap:
    """The wrappers and what they recorded since the reporter thread last drained them."""

    def __init__(self, clock: StepClock) -> None:
        self.clock = clock  # exposed time also goes to the step being timed (its phases)
        self.on = False  # set by the reporter thread while a collector listens
        self.records: deque[Record] = deque(maxlen=MAX_RECORDS)
        self.pending: dict[int, Issued] = {}  # by id(work), until its wait()
        # The functional collectives issued and not yet waited for, by the tensor their wait_tensor is called on
        # (``tensor_key``), the same fields: matched by identity, so a wait for one issued where the tap cannot see
        # (an autograd variant's backward, in C++) takes nothing of another's.
        self.functional: dict[int, Issued] = {}
        self.functional_groups: dict[Any, tuple[Any, GroupCounts | None]] = {}  # collective_functional.counts_for
        self.functional_shapes: dict[int, tuple[Any, int]] = {}  # the functional collectives' shapes seen
        self.depth = 0  # inside a wrapped collective: the collectives it calls are its own
        self.compiling: Callable[[], bool] = lambda: False  # torch.compiler.is_compiling, once installed
        self.errors = 0  # bookkeeping failures swallowed on the training thread
        self.cuda_calls = 0  # collectives counted whose times the host's clock cannot measure
        self._undo: list[tuple[Any, str, Any]] = []  # (owner, attribute, what was there)
        # Set by the reporter before ``install`` where the model is on one GPU off DDP: CUDA collectives and
        # their waits are timed by events on it (the CUDA wrappers are installed instead of the host-timed ones).
        self.timeline: CudaTimeline | None = None
        # Asynchronous CUDA collectives until their wait: id(work): (kind, group, the timeline's key of the event
        # recorded before the issue; 0: none).  The timeline holds the events: the tap holds keys, never one.
        self.cuda_pending: dict[int, tuple[str, Any, int]] = {}
        self.cuda_functional: dict[int, tuple[str, Any, int]] = {}  # the same, for functional collectives (by tensor)
        # Per process group (as the call named it; None: the default), its collectives issued and completed through
        # the tap, and the group whose newest (a blocking call) the training thread is in now (collective_numbers.py).
        self.numbers: dict[Any, GroupCounts] = {}
        self.sites = SiteDigests()  # each collective's digest (collective_digests.py)
        self.cuda_shapes: dict[int, tuple[Any, int]] = {}  # the CUDA wrappers' shapes seen: size -> (dtype, digest)
        self.inside: GroupCounts | None = None
        self.waiting: Issued | None = None  # the collective whose wait() or wait_tensor the thread is in now
        # How the reporter thread names a group (the collectives probe's names, DeviceMesh dimensions); set by it.
        self.name_group: Callable[[Any], str] | None = None
        # Inside an FSDP2 method that makes the compute stream wait (``FSDP_WAITS``): (kind, group, its
        # FSDPParamGroup), the innermost method's; None outside.
        self.wait_scope: WaitScope | None = None

    # -- installing -------------------------------------------------------------------

    def install(self) -> list[str]:
        """Wrap what torch.distributed offers here; the names wrapped (empty when it is not available)."""
        dist = sys.modules.get("torch.distributed")
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        if dist is None or c10d is None or not dist.is_available() or self._undo:
            return []
        compiled.learn_compiling()
        self.compiling = compiled.compiling
        remaps = self._dynamo_remaps()
        wrapped = []
        timed = self.timeline is not None  # the CUDA wrappers: chosen here, so the host-timed ones ask nothing more
        for name, (kind, tensor_name) in DIST_COLLECTIVES.items():
            original = getattr(c10d, name, None)
            if not callable(original) or hasattr(original, "__gputop_original__"):
                continue
            # Dynamo rewrites a call to a collective in its table and never runs the wrapper while it traces:
            # only the others need to ask whether it does (~0.1 µs a call).
            traced = remaps is None or original not in remaps
            where = Where.of(original, tensor_name)
            wrapper = self._wrap(original, kind, where, traced=traced)
            if timed:
                wrapper = collective_cuda.wrap_collective(self, wrapper, original, kind, where, traced=traced)
            for owner in (c10d, dist):
                if getattr(owner, name, None) is original:
                    self.replace(owner, name, wrapper, remaps)
            wrapped.append(name)
        for module_name, name in IMPORTED_AT:
            module, wrapped_there = sys.modules.get(module_name), getattr(c10d, name, None)
            bound = getattr(wrapped_there, "__gputop_original__", None)
            if module is not None and bound is not None and getattr(module, name, None) is bound:
                self.replace(module, name, wrapped_there, None)
        work = getattr(c10d, "Work", None)
        if work is not None and callable(getattr(work, "wait", None)):
            wait = self._wrap_wait(work.wait)
            self.replace(work, "wait", collective_cuda.wrap_wait(self, wait, work.wait) if timed else wait, None)
            wrapped.append("Work.wait")
        funcol = sys.modules.get("torch.distributed._functional_collectives")
        if funcol is not None:
            for name, (kind, tensor_name) in FUNCTIONAL_COLLECTIVES.items():
                original = getattr(funcol, name, None)
                if callable(original) and not hasattr(original, "__gputop_original__"):
                    where = Where.of(original, tensor_name)
                    functional = collective_functional.wrap_functional(self, original, kind, where)
                    if timed:
                        functional = collective_cuda.wrap_functional(self, functional, original, kind, where)
                    self.replace(funcol, name, functional, remaps)
                    wrapped.append(f"funcol.{name}")
            wait_tensor = getattr(funcol, "wait_tensor", None)
            if callable(wait_tensor):
                waiter = collective_functional.wrap_wait_tensor(self, wait_tensor)
                if timed:
                    waiter = collective_cuda.wrap_wait_tensor(self, waiter, wait_tensor)
                self.replace(funcol, "wait_tensor", waiter, None)
                wrapped.append("funcol.wait_tensor")
        if timed:
            wrapped += collective_cuda.install_batch_p2p(self, c10d, dist)
            wrapped += collective_cuda.install_fsdp_waits(self)
        return wrapped

    def forget_groups(self) -> None:
        """Drop the process groups counted, at the reporter's shutdown: gputop holds none into the interpreter's
        teardown, which destroys them in its own order (a gloo group destroyed late can abort the process)."""
        self.inside = self.waiting = None
        self.numbers.clear()
        self.functional_groups.clear()

    def uninstall(self) -> None:
        """Put every original back (tests; a process keeps its wrappers, which cost nothing while off)."""
        while self._undo:
            owner, name, original = self._undo.pop()
            setattr(owner, name, original)

    def replace(self, owner: Any, name: str, wrapper: Any, remaps: dict[Any, Any] | None) -> None:
        original = getattr(owner, name)
        setattr(owner, name, wrapper)
        self._undo.append((owner, name, original))
        if remaps is not None and original in remaps:  # dynamo rewrites the wrapper as it did the original
            remaps[wrapper] = remaps[original]

    @staticmethod
    def _dynamo_remaps() -> dict[Any, Any] | None:
        funcol = sys.modules.get("torch.distributed._functional_collectives")
        remaps = getattr(funcol, "traceable_collective_remaps", None)
        return remaps if isinstance(remaps, dict) else None

    # -- the wrappers: training thread ------------------------------------------------

    def _wrap(
        self, original: Callable[..., Any], kind: str, where: Where, *, traced: bool = True
    ) -> Callable[..., Any]:
        # All the call needs is a local of this closure: each lookup on the training thread costs ~50-200 ns.
        tap, perf, clock, records, numbers = self, time.perf_counter, self.clock, self.records, self.numbers
        compiling = self.compiling if traced else bool  # bool() is False, and the cheapest call there is
        tensor_at, tensor_name = (where.tensor_at, where.tensor_name) if where.tensor_at >= 0 else (1 << 20, None)
        group_at = where.group_at if where.group_at >= 0 else 1 << 20
        sites, shapes = self.sites, {}  # type: ignore[var-annotated]  # shapes: size -> (dtype, digest) seen here

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            # Off, inside another wrapped collective (object collectives call all_gather), or traced by dynamo.
            if compiling() or not tap.on or tap.depth:  # compiling() first: dynamo reads nothing of gputop's
                return original(*args, **kwargs)
            tap.depth = 1
            counts: GroupCounts | None = None
            number = None
            try:
                try:  # counted as issued before the call: a rank blocked in it is in it (collective_numbers)
                    tensor: Any = args[tensor_at] if tensor_at < len(args) else kwargs.get(tensor_name or "")
                    group = args[group_at] if group_at < len(args) else kwargs.get("group")
                    try:
                        nbytes, cpu, dtype = tensor.nbytes, tensor.is_cpu, tensor.dtype
                    except AttributeError:  # a list of tensors, or none (barrier)
                        nbytes, cpu, dtype = tensor_bytes(tensor), on_cpu(tensor), None
                    counts = numbers.get(group) or tap.count(group)
                    counts.issued += 1
                    counts.kind, counts.nbytes = kind, nbytes
                    tap.inside = counts
                    number = record(counts, sites, shapes, kind, dtype, nbytes, 2)  # its number and digest
                except Exception:
                    tap.errors += 1
                start = perf()
                result = original(*args, **kwargs)
                end = perf()
            finally:
                tap.depth = 0
                tap.inside = None
            try:
                if not cpu:
                    tap.cuda_calls += 1
                    counts.completed += 1  # type: ignore[union-attr]
                    records.append((kind, group, nbytes, None, None, end))
                elif result is None:  # it ran to completion in the call: all of it exposed
                    counts.completed += 1  # type: ignore[union-attr]
                    clock.comm_exposed_s += end - start
                    records.append((kind, group, nbytes, end - start, end - start, end))
                else:  # a Work: in flight until its wait() returns
                    clock.comm_exposed_s += end - start
                    tap.pend(id(result), (kind, group, nbytes, start, end - start, counts, number))
            except Exception:
                tap.errors += 1
            return result

        collective.__gputop_original__ = original  # type: ignore[attr-defined]
        return collective

    def count(self, group: Any) -> GroupCounts:
        """A group's counts, made at its first collective; None (the default group) counted as the default group."""
        counts = self.numbers.get(group)
        if counts is None:
            counts = GroupCounts(group if group is not None else default_group())
            self.numbers[group] = counts
            if group is None:  # one count for the default group, named or not
                counts = self.numbers.setdefault(counts.group, counts)
                self.numbers[None] = counts
        return counts

    def pend(self, key: int, issued: Issued, pending: dict[int, Issued] | None = None) -> None:
        """Keep an asynchronous collective until its wait, in ``pending`` (``self.pending``, the works'; or the
        functional collectives')."""
        pending = self.pending if pending is None else pending
        if len(pending) >= MAX_PENDING:  # never waited for in Python: counted, its time unknown
            kind, group, nbytes, *_ = pending.pop(next(iter(pending)))
            self.records.append((kind, group, nbytes, None, None, 0.0))
        pending[key] = issued

    def _wrap_wait(self, original: Callable[..., Any]) -> Callable[..., Any]:
        tap = self

        @functools.wraps(original)
        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            if tap.compiling() or not tap.on or not tap.pending:
                return original(work, *args, **kwargs)
            # None: a wait inside a blocking call, or for work issued elsewhere (DDP's C++ reducer)
            return tap.wait_through(tap.pending.pop(id(work), None), original, work, *args, **kwargs)

        return wait

    def wait_through(self, issued: Issued | None, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call a wait (``Work.wait``, ``wait_tensor``) for ``issued`` (None: not the tap's), the thread marked as
        waiting for it meanwhile (``collective_numbers.read_group``)."""
        self.waiting = issued
        try:
            start = time.perf_counter()
            result = original(*args, **kwargs)
            end = time.perf_counter()
        finally:
            self.waiting = None
        if issued is not None:
            try:
                self.waited(issued, start, end)
            except Exception:
                self.errors += 1
        return result

    def waited(self, issued: Issued, start: float, end: float) -> None:
        """An asynchronous collective waited for from ``start`` to ``end``: completed, that long exposed."""
        kind, group, nbytes, issued_s, issue_s, counts, _ = issued
        if counts is not None:
            counts.completed += 1
        self.clock.comm_exposed_s += end - start
        self.records.append((kind, group, nbytes, end - issued_s, issue_s + end - start, end))

    # -- the CUDA wrappers' scope (``collective_cuda.py``) ----------------------------------------------

    @contextlib.contextmanager
    def waits_for(self, kind: str, group: Any, owner: Any = None) -> Iterator[None]:
        """Inside: the compute stream's ``wait_event`` calls are waits for ``kind`` on ``group`` (FSDP2's methods
        that make it wait run in here, ``owner`` their FSDPParamGroup; the GPU check's known delay does too)."""
        outer, self.wait_scope = self.wait_scope, (kind, group, owner)
        try:
            yield
        finally:
            self.wait_scope = outer

    # -- the reporter thread ----------------------------------------------------------

    def drain(self, until_s: float = math.inf) -> Iterator[Record]:
        """The records of collectives that returned by ``until_s`` (perf_counter), oldest first.

        The reporter passes the end of the window's last step: a collective that returned after it belongs to
        the next step, and goes in the next window with it (a rank that waited 1.7 s in its own all-reduce at a
        step's end would otherwise show the wait in one window and the long step in the next).
        """
        records = self.records
        while records and records[0][5] <= until_s:
            try:
                yield records.popleft()
            except IndexError:
                return
