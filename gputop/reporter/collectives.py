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
installed are then the CUDA ones: a collective on CUDA tensors gets an event before and after it on the
stream it is issued on (a blocking one's time in flight; exposed as well where that is the compute
stream), and each wait (``Work.wait()``, ``wait_tensor``, FSDP2's ``current_stream().wait_event(...)``)
an event before and after it on the stream that waits: the compute stream's idle wait, the exposed time.
The timeline reads them on the reporter thread once they have completed.  Without a timeline (DDP, a
model on several GPUs, ``GPUTOP_CUDA_EVENTS=0``) CUDA collectives are counted with their bytes and their
times are N/A (``not_measured`` says so).

The reporter thread drains the records once a window (``gputop.reporter.probes.collectives``), names
each process group by its DeviceMesh dimension where it has one, and adds them up by kind and group.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gputop.reporter.clock import StepClock
from gputop.reporter.cuda_timeline import CudaTimeline

# A record per collective: (kind, group, bytes, in flight s, exposed s, perf_counter when it returned); times None
# where not measured (CUDA).  The return time puts it in the window of the step it belongs to (``drain``).
Record = tuple[str, Any, int, "float | None", "float | None", float]

# torch.distributed's collectives, each with its kind and the argument whose size is what the rank sends.
# Only the leaves: ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` are aliases in torch 2.13 whose
# bodies call ``all_gather_single`` / ``reduce_scatter_single``, so wrapping those would count each twice.
# Each is wrapped on ``torch.distributed`` (FSDP2, user code: ``dist.<name>`` at call time) and on
# ``torch.distributed.distributed_c10d`` (the aliases' and deepspeed.comm's cached calls end there).
DIST_COLLECTIVES: dict[str, tuple[str, str | None]] = {
    "all_reduce": ("all_reduce", "tensor"),
    "all_reduce_coalesced": ("all_reduce", "tensors"),
    "all_gather": ("all_gather", "tensor"),
    "all_gather_single": ("all_gather", "input_tensor"),
    "all_gather_coalesced": ("all_gather", "input_tensor_list"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "broadcast": ("broadcast", "tensor"),
    "all_to_all": ("all_to_all", "input_tensor_list"),
    "all_to_all_single": ("all_to_all", "input"),
    "reduce": ("reduce", "tensor"),
    "gather": ("gather", "tensor"),
    "scatter": ("scatter", "tensor"),
    "send": ("send", "tensor"),
    "recv": ("recv", "tensor"),
    "isend": ("send", "tensor"),
    "irecv": ("recv", "tensor"),
    "barrier": ("barrier", None),
}
# The functional collectives DTensor's redistribution calls (``funcol.<name>``, looked up at call time):
# they return at once, and are waited for in ``wait_tensor`` when the result is first used.
FUNCTIONAL_COLLECTIVES: dict[str, tuple[str, str]] = {
    "all_reduce": ("all_reduce", "self"),
    "all_gather_single": ("all_gather", "self"),
    "all_gather_tensor": ("all_gather", "self"),
    "reduce_scatter_single": ("reduce_scatter", "self"),
    "reduce_scatter_tensor": ("reduce_scatter", "self"),
    "all_to_all_single": ("all_to_all", "self"),
    "broadcast": ("broadcast", "self"),
}
# Modules that bound a c10d collective at import (``from … import broadcast``): DTensor's mesh helpers.
IMPORTED_AT: tuple[tuple[str, str], ...] = (
    ("torch.distributed.tensor._collective_utils", "broadcast"),
    ("torch.distributed.tensor._collective_utils", "scatter"),
)
# FSDP2's parameter group, where each torch has it: torch.distributed.fsdp._fully_shard from 2.6,
# torch.distributed._composable.fsdp in 2.4 and 2.5 (before 2.4 there is no FSDP2).
FSDP_PARAM_GROUP_MODULES = (
    "torch.distributed.fsdp._fully_shard._fsdp_param_group",
    "torch.distributed._composable.fsdp._fsdp_param_group",
)
# The FSDPParamGroup methods inside which FSDP2 makes the compute stream wait for its collectives, with
# ``current_stream().wait_event(event)`` (``Work.wait()`` for an asynchronous all-gather, which the tap times
# anyway): the all-gather's before a block's forward and backward (``wait_for_unshard``, which calls
# ``foreach_all_gather_copy_out``), the previous reduce-scatter's in ``post_backward`` (a bounded number in
# flight) and every last one's in ``finalize_backward``, at the end of backward, before the optimizer.  Each
# with the kind and the group attribute the wait is for.  The same three names from 2.4 to 2.13.
FSDP_WAITS = (
    ("wait_for_unshard", "all_gather", "_all_gather_process_group"),
    ("post_backward", "reduce_scatter", "_reduce_scatter_process_group"),
    ("finalize_backward", "reduce_scatter", "_reduce_scatter_process_group"),
)
# Asynchronous collectives issued and not yet waited for: a job that never waits in Python (or waits in
# C++) must not grow this without bound.  FSDP2 keeps a few in flight; a thousand is far past any.
MAX_PENDING = 1024
# Records between two windows: at 64 collectives a step and 1,000 steps a second, a whole window.
MAX_RECORDS = 1 << 16


@dataclass(frozen=True)
class Where:
    """Where a wrapped function takes the tensor that is sent and the process group, by position or name."""

    tensor_name: str | None
    tensor_at: int
    group_at: int

    @classmethod
    def of(cls, function: Callable[..., Any], tensor_name: str | None) -> Where:
        names = list(inspect.signature(function).parameters)
        tensor_at = names.index(tensor_name) if tensor_name in names else -1
        return cls(tensor_name, tensor_at, names.index("group") if "group" in names else -1)

    def tensor(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if 0 <= self.tensor_at < len(args):
            return args[self.tensor_at]
        return kwargs.get(self.tensor_name) if self.tensor_name else None

    def group(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if 0 <= self.group_at < len(args):
            return args[self.group_at]
        return kwargs.get("group")


def tensor_bytes(value: Any) -> int:
    """The size of a tensor, or of a list of them; 0 for anything else."""
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(value, (list, tuple)):
        return sum(getattr(t, "nbytes", 0) for t in value)
    return 0


def _sent(where: Where, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The tensor a collective sends, or None where it cannot be told (then it is timed as on the host)."""
    try:
        return where.tensor(args, kwargs)
    except Exception:
        return None


def _shared_group(param_group: Any, attribute: str) -> Any:
    """An FSDP2 parameter group's process group for a kind of wait, where it has more than one rank; else None."""
    try:
        group = getattr(param_group, attribute)
        return group if group.size() > 1 else None
    except Exception:
        return None


def on_cpu(value: Any) -> bool:
    """Whether the host's clock times this collective: its tensor is in host memory (gloo, or MPI)."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return value is None or bool(getattr(value, "is_cpu", True))


class CollectiveTap:
    """The wrappers and what they recorded since the reporter thread last drained them."""

    def __init__(self, clock: StepClock) -> None:
        self.clock = clock  # exposed time also goes to the step being timed (its phases)
        self.on = False  # set by the reporter thread while a collector listens
        self.records: deque[Record] = deque(maxlen=MAX_RECORDS)
        # id(work): (kind, group, bytes, issued at, the issue call's own time), until its wait()
        self.pending: dict[int, tuple[str, Any, int, float, float]] = {}
        # The functional collectives issued and not yet waited for, oldest first, the same fields
        self._functional: deque[tuple[str, Any, int, float, float]] = deque(maxlen=MAX_PENDING)
        self._depth = 0  # inside a wrapped collective: the collectives it calls are its own
        self._compiling: Any = lambda: False  # torch.compiler.is_compiling, once installed
        self.errors = 0  # bookkeeping failures swallowed on the training thread
        self.cuda_calls = 0  # collectives counted whose times the host's clock cannot measure
        self._undo: list[tuple[Any, str, Any]] = []  # (owner, attribute, what was there)
        # Set by the reporter before ``install`` where the model is on one GPU off DDP: CUDA collectives and
        # their waits are timed by events on it (the CUDA wrappers are installed instead of the host-timed ones).
        self.timeline: CudaTimeline | None = None
        # Asynchronous CUDA collectives until their wait: id(work): (kind, group, the timeline's key of the event
        # recorded before the issue; 0: none).  The timeline holds the events: the tap holds keys, never one.
        self._cuda_pending: dict[int, tuple[str, Any, int]] = {}
        self._cuda_functional: deque[tuple[str, Any, int]] = deque()  # the same, for functional collectives
        # Inside an FSDP2 method that makes the compute stream wait (``FSDP_WAITS``): (kind, group).
        self._wait_scope: tuple[str, Any] | None = None

    # -- installing -------------------------------------------------------------------

    def install(self) -> list[str]:
        """Wrap what torch.distributed offers here; the names wrapped (empty when it is not available)."""
        dist = sys.modules.get("torch.distributed")
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        if dist is None or c10d is None or not dist.is_available() or self._undo:
            return []
        compiler = getattr(sys.modules.get("torch"), "compiler", None)
        self._compiling = getattr(compiler, "is_compiling", lambda: False)
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
                wrapper = self._wrap_cuda(wrapper, original, kind, where, traced=traced)
            for owner in (c10d, dist):
                if getattr(owner, name, None) is original:
                    self._replace(owner, name, wrapper, remaps)
            wrapped.append(name)
        for module_name, name in IMPORTED_AT:
            module, wrapped_there = sys.modules.get(module_name), getattr(c10d, name, None)
            bound = getattr(wrapped_there, "__gputop_original__", None)
            if module is not None and bound is not None and getattr(module, name, None) is bound:
                self._replace(module, name, wrapped_there, None)
        work = getattr(c10d, "Work", None)
        if work is not None and callable(getattr(work, "wait", None)):
            wait = self._wrap_wait(work.wait)
            self._replace(work, "wait", self._wrap_wait_cuda(wait, work.wait) if timed else wait, None)
            wrapped.append("Work.wait")
        funcol = sys.modules.get("torch.distributed._functional_collectives")
        if funcol is not None:
            for name, (kind, tensor_name) in FUNCTIONAL_COLLECTIVES.items():
                original = getattr(funcol, name, None)
                if callable(original) and not hasattr(original, "__gputop_original__"):
                    where = Where.of(original, tensor_name)
                    functional = self._wrap_functional(original, kind, where)
                    if timed:
                        functional = self._wrap_functional_cuda(functional, original, kind, where)
                    self._replace(funcol, name, functional, remaps)
                    wrapped.append(f"funcol.{name}")
            wait_tensor = getattr(funcol, "wait_tensor", None)
            if callable(wait_tensor):
                waiter = self._wrap_wait_tensor(wait_tensor)
                if timed:
                    waiter = self._wrap_wait_tensor_cuda(waiter, wait_tensor)
                self._replace(funcol, "wait_tensor", waiter, None)
                wrapped.append("funcol.wait_tensor")
        if timed:
            wrapped += self._install_fsdp_waits()
        return wrapped

    def _install_fsdp_waits(self) -> list[str]:
        """Time the waits FSDP2 makes the compute stream do: its loaded ``FSDPParamGroup`` (``FSDP_WAITS``), and
        ``torch.cuda.Stream.wait_event``, which times a wait only inside one of those methods."""
        classes: list[Any] = []
        for module_name in FSDP_PARAM_GROUP_MODULES:
            found = getattr(sys.modules.get(module_name), "FSDPParamGroup", None)
            if found is not None and found not in classes:
                classes.append(found)
        if not classes:
            return []  # no FSDP2 in this process (watch() after fully_shard: it is loaded by then)
        timeline = self.timeline
        assert timeline is not None
        stream = getattr(sys.modules.get("torch.cuda"), "Stream", None)
        wait_event = getattr(stream, "wait_event", None)
        if not callable(wait_event):
            timeline.missing.append("torch.cuda.Stream.wait_event is not there: FSDP2's waits are not timed")
            return []
        wrapped = []
        for found in classes:
            for method, kind, group_attribute in FSDP_WAITS:
                original = getattr(found, method, None)
                if not callable(original):
                    timeline.missing.append(f"FSDP2's {method} is not in this torch: the waits in it are not timed")
                elif not hasattr(original, "__gputop_original__"):
                    self._replace(found, method, self._wrap_fsdp_scope(original, kind, group_attribute), None)
                    wrapped.append(f"FSDPParamGroup.{method}")
        if wrapped and not hasattr(wait_event, "__gputop_original__"):
            self._replace(stream, "wait_event", self._wrap_wait_event(wait_event), None)
            wrapped.append("Stream.wait_event")
        return wrapped

    def uninstall(self) -> None:
        """Put every original back (tests; a process keeps its wrappers, which cost nothing while off)."""
        while self._undo:
            owner, name, original = self._undo.pop()
            setattr(owner, name, original)

    def _replace(self, owner: Any, name: str, wrapper: Any, remaps: dict[Any, Any] | None) -> None:
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
        # Everything the call needs is a local of this closure: each attribute or method looked up on the
        # training thread costs ~50-200 ns here, against a budget of ~1 µs a collective.
        tap, perf, clock, records = self, time.perf_counter, self.clock, self.records
        compiling = self._compiling if traced else bool  # bool() is False, and the cheapest call there is
        tensor_at, tensor_name = (where.tensor_at, where.tensor_name) if where.tensor_at >= 0 else (1 << 20, None)
        group_at = where.group_at if where.group_at >= 0 else 1 << 20

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            # Off, inside another wrapped collective (object collectives call all_gather), or traced by dynamo.
            if not tap.on or tap._depth or compiling():
                return original(*args, **kwargs)
            tap._depth = 1
            try:
                start = perf()
                result = original(*args, **kwargs)
                end = perf()
            finally:
                tap._depth = 0
            try:
                tensor: Any = args[tensor_at] if tensor_at < len(args) else kwargs.get(tensor_name or "")
                group = args[group_at] if group_at < len(args) else kwargs.get("group")
                try:
                    nbytes, cpu = tensor.nbytes, tensor.is_cpu
                except AttributeError:  # a list of tensors, or none (barrier)
                    nbytes, cpu = tensor_bytes(tensor), on_cpu(tensor)
                if not cpu:
                    tap.cuda_calls += 1
                    records.append((kind, group, nbytes, None, None, end))
                elif result is None:  # it ran to completion in the call: all of it exposed
                    clock.comm_exposed_s += end - start
                    records.append((kind, group, nbytes, end - start, end - start, end))
                else:  # a Work: in flight until its wait() returns
                    clock.comm_exposed_s += end - start
                    tap._pend(id(result), (kind, group, nbytes, start, end - start))
            except Exception:
                tap.errors += 1
            return result

        collective.__gputop_original__ = original  # type: ignore[attr-defined]
        return collective

    def _pend(self, key: int, issued: tuple[str, Any, int, float, float]) -> None:
        pending = self.pending
        if len(pending) >= MAX_PENDING:  # never waited for in Python: counted, its time unknown
            kind, group, nbytes, _, _ = pending.pop(next(iter(pending)))
            self.records.append((kind, group, nbytes, None, None, 0.0))
        pending[key] = issued

    def _wrap_wait(self, original: Callable[..., Any]) -> Callable[..., Any]:
        tap, perf = self, time.perf_counter

        @functools.wraps(original)
        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            if not tap.on or not tap.pending:
                return original(work, *args, **kwargs)
            start = perf()
            result = original(work, *args, **kwargs)
            try:
                tap._waited(id(work), start, perf())
            except Exception:
                tap.errors += 1
            return result

        return wait

    def _waited(self, key: int, start: float, end: float) -> None:
        issued = self.pending.pop(key, None)
        if issued is None:  # a wait inside a blocking call, or for work issued elsewhere (DDP's C++ reducer)
            return
        kind, group, nbytes, issued_s, issue_s = issued
        self.clock.comm_exposed_s += end - start
        self.records.append((kind, group, nbytes, end - issued_s, issue_s + end - start, end))

    def _wrap_functional(self, original: Callable[..., Any], kind: str, where: Where) -> Callable[..., Any]:
        tap, perf = self, time.perf_counter

        @functools.wraps(original)
        def functional(*args: Any, **kwargs: Any) -> Any:
            if not tap.on or tap._depth or tap._compiling():
                return original(*args, **kwargs)
            tap._depth = 1
            try:
                start = perf()
                result = original(*args, **kwargs)
                end = perf()
            finally:
                tap._depth = 0
            try:
                tensor, group = where.tensor(args, kwargs), where.group(args, kwargs)
                if not on_cpu(tensor):
                    tap.cuda_calls += 1
                    tap.records.append((kind, group, tensor_bytes(tensor), None, None, end))
                else:
                    # Waited for when first used, through wait_tensor on the result or a view of it: the waits
                    # are matched to the functional collectives in the order they were issued.
                    tap.clock.comm_exposed_s += end - start
                    tap._functional.append((kind, group, tensor_bytes(tensor), start, end - start))
            except Exception:
                tap.errors += 1
            return result

        functional.__gputop_original__ = original  # type: ignore[attr-defined]
        return functional

    def _wrap_wait_tensor(self, original: Callable[..., Any]) -> Callable[..., Any]:
        tap, perf = self, time.perf_counter

        @functools.wraps(original)
        def wait_tensor(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if not tap.on or not tap._functional:
                return original(tensor, *args, **kwargs)
            start = perf()
            result = original(tensor, *args, **kwargs)
            end = perf()
            try:
                kind, group, nbytes, issued_s, issue_s = tap._functional.popleft()
                tap.clock.comm_exposed_s += end - start
                tap.records.append((kind, group, nbytes, end - issued_s, issue_s + end - start, end))
            except IndexError:
                pass
            return result

        return wait_tensor

    # -- the CUDA wrappers: training thread (and the autograd engine's, for backward hooks) ----------

    def _wrap_cuda(
        self, host: Callable[..., Any], original: Callable[..., Any], kind: str, where: Where, *, traced: bool = True
    ) -> Callable[..., Any]:
        """A collective whose tensors may be on the GPU: events around it there; ``host`` times CPU tensors."""
        tap, perf, records = self, time.perf_counter, self.records
        compiling = self._compiling if traced else bool

        @functools.wraps(original)
        def collective(*args: Any, **kwargs: Any) -> Any:
            if not tap.on or tap._depth or compiling():
                return original(*args, **kwargs)
            tensor, timeline = _sent(where, args, kwargs), tap.timeline
            if timeline is None or on_cpu(tensor):
                return host(*args, **kwargs)
            # An event on the current stream first: the compute stream, or the side stream it runs on.
            key, result = tap._issue_on_cuda(timeline, original, args, kwargs)
            try:
                group = where.group(args, kwargs)
                records.append((kind, group, tensor_bytes(tensor), None, None, perf()))  # counted; timed by events
                if result is None:  # it ran to completion on that stream, as far as the streams can tell
                    timeline.end_blocking(key, kind, group)
                else:  # a Work: in flight from here to the end of its wait(), or NCCL's own duration of it
                    tap._pend_cuda(id(result), (kind, group, key))
            except Exception:
                tap.errors += 1
            return result

        collective.__gputop_original__ = original  # type: ignore[attr-defined]
        return collective

    def _issue_on_cuda(
        self, timeline: CudaTimeline, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[int, Any]:
        """Call a collective after an event on the current stream, the collectives it calls its own: (the event's
        key, what it returned).  A collective that raises gives its event back to the pool, and raises."""
        key = timeline.begin()
        self._depth = 1
        try:
            return key, original(*args, **kwargs)
        except BaseException:
            timeline.abandon(key)
            raise
        finally:
            self._depth = 0

    def _pend_cuda(self, key: int, issued: tuple[str, Any, int]) -> None:
        pending = self._cuda_pending
        if len(pending) >= MAX_PENDING:  # never waited for in Python: its issue's event goes back to the pool
            _, _, event_key = pending.pop(next(iter(pending)))
            if self.timeline is not None:
                self.timeline.abandon(event_key)
        pending[key] = issued

    def _wrap_wait_cuda(self, host: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
        """``Work.wait()`` of a CUDA collective: the current stream waits for it, between two events there."""
        tap = self

        @functools.wraps(original)
        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            if not tap.on or not tap._cuda_pending:
                return host(work, *args, **kwargs)
            issued, timeline = tap._cuda_pending.pop(id(work), None), tap.timeline
            if issued is None or timeline is None:  # a CPU work, a wait inside a blocking call, work issued elsewhere
                return host(work, *args, **kwargs)
            kind, group, issue_key = issued
            if timeline.nccl_timing and timeline.track_work(work, kind, group):  # NCCL's own duration of it instead
                timeline.abandon(issue_key)
                issue_key = 0
            key = timeline.begin()
            try:
                return original(work, *args, **kwargs)
            finally:
                timeline.end_wait(key, kind, group, issue_key)

        return wait

    def _wrap_functional_cuda(
        self, host: Callable[..., Any], original: Callable[..., Any], kind: str, where: Where
    ) -> Callable[..., Any]:
        """A functional collective on CUDA tensors: an event before its issue; its wait is ``wait_tensor``'s."""
        tap, perf = self, time.perf_counter

        @functools.wraps(original)
        def functional(*args: Any, **kwargs: Any) -> Any:
            if not tap.on or tap._depth or tap._compiling():
                return original(*args, **kwargs)
            tensor, timeline = _sent(where, args, kwargs), tap.timeline
            if timeline is None or on_cpu(tensor):
                return host(*args, **kwargs)
            key, result = tap._issue_on_cuda(timeline, original, args, kwargs)
            try:
                group = where.group(args, kwargs)
                tap.records.append((kind, group, tensor_bytes(tensor), None, None, perf()))
                waiting = tap._cuda_functional
                if len(waiting) >= MAX_PENDING:  # never waited for: its event back to the pool
                    timeline.abandon(waiting.popleft()[2])
                waiting.append((kind, group, key))
            except Exception:
                tap.errors += 1
            return result

        functional.__gputop_original__ = original  # type: ignore[attr-defined]
        return functional

    def _wrap_wait_tensor_cuda(self, host: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
        """``wait_tensor`` on a CUDA tensor: the current stream waits, between two events there; matched to the
        functional collectives in the order they were issued, as on the host."""
        tap = self

        @functools.wraps(original)
        def wait_tensor(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            timeline = tap.timeline
            if not tap.on or not tap._cuda_functional or timeline is None or getattr(tensor, "is_cpu", True):
                return host(tensor, *args, **kwargs)
            try:
                kind, group, issue_key = tap._cuda_functional.popleft()
            except IndexError:
                return original(tensor, *args, **kwargs)
            key = timeline.begin()
            try:
                return original(tensor, *args, **kwargs)
            finally:
                timeline.end_wait(key, kind, group, issue_key)

        return wait_tensor

    @contextlib.contextmanager
    def waits_for(self, kind: str, group: Any) -> Iterator[None]:
        """Inside: the compute stream's ``wait_event`` calls are waits for ``kind`` on ``group`` (FSDP2's methods
        that make it wait run in here; the GPU check's known delay does too)."""
        self._wait_scope = (kind, group)
        try:
            yield
        finally:
            self._wait_scope = None

    def _wrap_fsdp_scope(self, original: Callable[..., Any], kind: str, group_attribute: str) -> Callable[..., Any]:
        """An FSDPParamGroup method that makes the compute stream wait: its waits are ``kind`` on its group.

        A group of one rank issues no collective (FSDP2 copies instead): its waits are left untimed, not
        passed off as communication.
        """
        tap = self

        @functools.wraps(original)
        def scoped(param_group: Any, *args: Any, **kwargs: Any) -> Any:
            if not tap.on or tap._wait_scope is not None or tap._compiling():
                return original(param_group, *args, **kwargs)
            group = _shared_group(param_group, group_attribute)
            if group is None:
                return original(param_group, *args, **kwargs)
            with tap.waits_for(kind, group):
                return original(param_group, *args, **kwargs)

        scoped.__gputop_original__ = original  # type: ignore[attr-defined]
        return scoped

    def _wrap_wait_event(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``torch.cuda.Stream.wait_event``: timed only inside ``waits_for`` (FSDP2's waits), only on the compute
        stream (FSDP2's side streams wait on each other too: that is no one's exposed time); else straight through."""
        tap = self

        @functools.wraps(original)
        def wait_event(stream: Any, event: Any) -> Any:
            scope, timeline = tap._wait_scope, tap.timeline
            if scope is None or not tap.on or timeline is None:
                return original(stream, event)
            key = timeline.begin(stream, compute_only=True)
            if not key:
                return original(stream, event)
            try:
                return original(stream, event)
            finally:
                timeline.end_wait(key, scope[0], scope[1])

        wait_event.__gputop_original__ = original  # type: ignore[attr-defined]
        return wait_event

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
