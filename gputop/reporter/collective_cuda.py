"""The collective tap's CUDA wrappers: a collective on CUDA tensors, and each wait for one, timed by CUDA events on
the rank's ``CudaTimeline``, never by the host's clock (on CUDA a collective returns once it is queued).

Installed in place of the host-timed wrappers where the model is on one GPU and off DDP (the reporter gives the
tap a timeline first).  A collective gets an event before and after it on the stream it is issued on (a
blocking one's time in flight; exposed as well where that is the compute stream), and each wait
(``Work.wait()``, ``wait_tensor``, FSDP2's ``current_stream().wait_event(...)`` inside its ``FSDP_WAITS``
methods) an event before and after it on the stream that waits: the compute stream's idle wait, the exposed
time.  The timeline reads them on the reporter thread once they have completed.  A wrapper whose tensors are
on the host hands the call to the host-timed wrapper it stands in front of.  Training thread (and the autograd
engine's, for backward hooks); like the host's, a wrapper never raises anything of its own.
"""

from __future__ import annotations

import functools
import sys
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from gputop.reporter import collective_functional
from gputop.reporter.collective_calls import (
    FSDP_PACKAGES,
    FSDP_WAITS,
    MAX_PENDING,
    WaitScope,
    Where,
    fsdp_wait,
    on_cpu,
    param_group_of,
    sent,
    shared_group,
    tensor_bytes,
    tensor_key,
    waited_tensor,
)
from gputop.reporter.collective_digests import SiteDigests, record
from gputop.reporter.collective_numbers import GroupCounts
from gputop.reporter.cuda_timeline import CudaTimeline


class CollectiveTap(Protocol):
    """What of the tap (``collectives.CollectiveTap``) its CUDA wrappers read and keep."""

    on: bool
    depth: int
    errors: int
    timeline: CudaTimeline | None
    records: deque[Any]
    compiling: Callable[[], bool]
    # Asynchronous CUDA collectives until their wait: id(work): (kind, group, the timeline's key of the event
    # recorded before the issue; 0: none), and the same for functional collectives, oldest first.
    cuda_pending: dict[int, tuple[str, Any, int]]
    cuda_functional: dict[int, tuple[str, Any, int]]
    wait_scope: WaitScope | None
    sites: SiteDigests  # each collective's digest (collective_digests.py)
    cuda_shapes: dict[int, tuple[Any, int]]  # the CUDA collectives' shapes seen: size -> (dtype, digest)
    numbers: dict[Any, GroupCounts]  # per process group, its collectives issued and completed (collective_numbers)
    functional_groups: dict[Any, tuple[Any, GroupCounts | None]]  # collective_functional.counts_for's
    functional_shapes: dict[int, tuple[Any, int]]

    def count(self, group: Any) -> GroupCounts: ...

    def replace(self, owner: Any, name: str, wrapper: Any, remaps: dict[Any, Any] | None) -> None: ...

    def waits_for(self, kind: str, group: Any, owner: Any = None) -> AbstractContextManager[None]: ...


def install_fsdp_waits(tap: CollectiveTap) -> list[str]:
    """Time the waits FSDP2 makes the compute stream do: the methods of its loaded classes in ``FSDP_WAITS``, and
    ``torch.cuda.Stream.wait_event``, which times a wait only inside one of those methods."""
    methods: list[tuple[Any, str, str]] = []  # (class, method, kind)
    for package in FSDP_PACKAGES:
        for module, name, method, kind in FSDP_WAITS:
            found = getattr(sys.modules.get(f"{package}.{module}"), name, None)
            if found is not None:
                methods.append((found, method, kind))
    if not methods:
        return []  # no FSDP2 in this process (watch() after fully_shard: it is loaded by then)
    timeline = tap.timeline
    assert timeline is not None
    stream = getattr(sys.modules.get("torch.cuda"), "Stream", None)
    wait_event = getattr(stream, "wait_event", None)
    if not callable(wait_event):
        timeline.missing.append("torch.cuda.Stream.wait_event is not there: FSDP2's waits are not timed")
        return []
    wrapped = []
    for found, method, kind in methods:
        original = getattr(found, method, None)
        if not callable(original):
            timeline.missing.append(f"FSDP2's {method} is not in this torch: the waits in it are not timed")
        elif not hasattr(original, "__gputop_original__"):
            tap.replace(found, method, wrap_fsdp_scope(tap, original, kind), None)
            wrapped.append(f"{found.__name__}.{method}")
    if wrapped and not hasattr(wait_event, "__gputop_original__"):
        tap.replace(stream, "wait_event", wrap_wait_event(tap, wait_event), None)
        wrapped.append("Stream.wait_event")
    accelerator = sys.modules.get("torch.accelerator")
    current = getattr(accelerator, "current_stream", None)
    if wrapped and callable(current) and not hasattr(current, "__gputop_original__"):
        cuda_stream = sys.modules["torch.cuda"].current_stream
        tap.replace(accelerator, "current_stream", wrap_accelerator_stream(tap, current, cuda_stream), None)
        wrapped.append("accelerator.current_stream")
    return wrapped


def wrap_collective(
    tap: CollectiveTap,
    host: Callable[..., Any],
    original: Callable[..., Any],
    kind: str,
    where: Where,
    *,
    traced: bool = True,
) -> Callable[..., Any]:
    """A collective whose tensors may be on the GPU: events around it there; ``host`` times CPU tensors."""
    perf, records = time.perf_counter, tap.records
    compiling = tap.compiling if traced else bool

    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if compiling() or not tap.on or tap.depth:  # compiling() first: dynamo reads nothing of gputop's
            return original(*args, **kwargs)
        tensor, timeline = sent(where, args, kwargs), tap.timeline
        if timeline is None or on_cpu(tensor):
            return host(*args, **kwargs)
        counts = _count_issued(tap, kind, where.group(args, kwargs), tensor)
        # An event on the current stream first: the compute stream, or the side stream it runs on.
        key, result = _issue(tap, timeline, original, args, kwargs)
        try:
            if counts is not None:
                counts.completed += 1  # queued on its stream: the host is done with it (NCCL's own wait is the GPU's)
            group = where.group(args, kwargs)
            records.append((kind, group, tensor_bytes(tensor), None, None, perf()))  # counted; timed by events
            if result is None:  # it ran to completion on that stream, as far as the streams can tell
                timeline.end_blocking(key, kind, group)
            elif discarded(result):  # queued inside _coalescing_manager: the manager's own work is the one waited
                timeline.abandon(key)
            else:  # a Work: in flight from here to the end of its wait(), or NCCL's own duration of it
                _pend(tap, id(result), (kind, group, key))
        except Exception:
            tap.errors += 1
        return result

    collective.__gputop_original__ = original  # type: ignore[attr-defined]
    return collective


def _count_issued(tap: CollectiveTap, kind: str, group: Any, tensor: Any) -> GroupCounts | None:
    """The collective counted as issued on its group (collective_numbers.py), its digest at its number first
    (collective_digests.py); None where the bookkeeping failed."""
    try:
        counts = tap.numbers.get(group) or tap.count(group)
        nbytes = tensor_bytes(tensor)
        counts.issued += 1
        counts.kind, counts.nbytes = kind, nbytes
        record(counts, tap.sites, tap.cuda_shapes, kind, getattr(tensor, "dtype", None), nbytes, 3)
        return counts
    except Exception:
        tap.errors += 1
        return None


def _issue(
    tap: CollectiveTap,
    timeline: CudaTimeline,
    original: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[int, Any]:
    """Call a collective after an event on the current stream, the collectives it calls its own: (the event's
    key, what it returned).  A collective that raises gives its event back to the pool, and raises."""
    key = timeline.begin()
    tap.depth = 1
    try:
        return key, original(*args, **kwargs)
    except BaseException:
        timeline.abandon(key)
        raise
    finally:
        tap.depth = 0


def discarded(work: Any) -> bool:
    """A work torch hands back only to be thrown away: inside ``_coalescing_manager`` every collective returns an
    ``_IllegalWork`` whose ``wait()`` raises; the manager's own work stands for the batch.  Never waited, and its id
    is free for the next object as soon as it is dropped."""
    return type(work).__name__ == "_IllegalWork"


def _pend(
    tap: CollectiveTap, key: int, issued: tuple[str, Any, int], pending: dict[int, tuple[str, Any, int]] | None = None
) -> None:
    """Keep an asynchronous collective's issue event until its wait, in ``pending`` (the works', by default; or the
    functional collectives', by tensor)."""
    pending = tap.cuda_pending if pending is None else pending
    stale = pending.pop(key, None)  # a work of this id was dropped unwaited and its id reused: it is never waited
    if stale is not None and tap.timeline is not None:
        tap.timeline.abandon(stale[2])
    if len(pending) >= MAX_PENDING:  # never waited for in Python: its issue's event goes back to the pool
        _, _, event_key = pending.pop(next(iter(pending)))
        if tap.timeline is not None:
            tap.timeline.abandon(event_key)
    pending[key] = issued


def install_batch_p2p(tap: CollectiveTap, c10d: Any, dist: Any) -> list[str]:
    """Time ``batch_isend_irecv``'s coalesced work (``wrap_batch_p2p``) where torch.distributed has it."""
    original = getattr(c10d, "batch_isend_irecv", None)
    if not callable(original) or hasattr(original, "__gputop_original__"):
        return []
    batched = wrap_batch_p2p(tap, original)
    for owner in (c10d, dist):
        if getattr(owner, "batch_isend_irecv", None) is original:
            tap.replace(owner, "batch_isend_irecv", batched, None)
    return ["batch_isend_irecv"]


def wrap_batch_p2p(tap: CollectiveTap, original: Callable[..., Any]) -> Callable[..., Any]:
    """``batch_isend_irecv`` on CUDA tensors: NCCL coalesces the batch into one work (each ``isend`` and ``irecv``
    inside hands back a throwaway, its event given back, though its bytes are counted), in flight from the
    batch's issue to that work's wait, and exposed for the wait: pipeline parallelism's stage-to-stage exchange.
    Booked under the first operation's kind (a batch's sends and receives complete together)."""

    @functools.wraps(original)
    def batch_isend_irecv(p2p_op_list: Any, *args: Any, **kwargs: Any) -> Any:
        timeline = tap.timeline
        if tap.compiling() or not tap.on or tap.depth or timeline is None:
            return original(p2p_op_list, *args, **kwargs)
        try:
            first = p2p_op_list[0]
            tensor, group = first.tensor, first.group
            kind = "recv" if getattr(first.op, "__name__", "").endswith("recv") else "send"
        except Exception:
            return original(p2p_op_list, *args, **kwargs)
        if on_cpu(tensor):  # each of its works is its own, timed by the host's wrappers
            return original(p2p_op_list, *args, **kwargs)
        key = timeline.begin()
        try:
            works = original(p2p_op_list, *args, **kwargs)
        except BaseException:
            timeline.abandon(key)
            raise
        try:
            if not works:  # synchronized in C++: done on the stream
                timeline.end_blocking(key, kind, group)
            elif id(works[0]) in tap.cuda_pending:  # not coalesced: each work pended by its own isend or irecv
                timeline.abandon(key)
            else:
                _pend(tap, id(works[0]), (kind, group, key))
        except Exception:
            tap.errors += 1
        return works

    batch_isend_irecv.__gputop_original__ = original  # type: ignore[attr-defined]
    return batch_isend_irecv


def wrap_wait(tap: CollectiveTap, host: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """``Work.wait()`` of a CUDA collective: the current stream waits for it, between two events there."""

    @functools.wraps(original)
    def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
        if tap.compiling() or not tap.on or not tap.cuda_pending:
            return host(work, *args, **kwargs)
        issued, timeline = tap.cuda_pending.pop(id(work), None), tap.timeline
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


def wrap_functional(
    tap: CollectiveTap, host: Callable[..., Any], original: Callable[..., Any], kind: str, where: Where
) -> Callable[..., Any]:
    """A functional collective on CUDA tensors: an event before its issue; its wait is ``wait_tensor``'s."""
    perf = time.perf_counter

    @functools.wraps(original)
    def functional(*args: Any, **kwargs: Any) -> Any:
        if tap.compiling() or not tap.on or tap.depth:
            return original(*args, **kwargs)
        tensor, timeline, group = sent(where, args, kwargs), tap.timeline, where.group(args, kwargs)
        if timeline is None or on_cpu(tensor):
            return host(*args, **kwargs)
        try:  # numbered on its group like the host's, completed once queued
            collective_functional.queued(tap, group, kind, tensor)
        except Exception:
            tap.errors += 1
        key, result = _issue(tap, timeline, original, args, kwargs)
        try:
            waited = waited_tensor(result)
            tap.records.append((kind, group, tensor_bytes(tensor), None, None, perf()))
            if waited is None:  # waited for inside the call: on the stream, from the issue to here
                timeline.end_blocking(key, kind, group)
            else:
                _pend(tap, tensor_key(waited), (kind, group, key), tap.cuda_functional)
        except Exception:
            tap.errors += 1
        return result

    functional.__gputop_original__ = original  # type: ignore[attr-defined]
    return functional


def wrap_wait_tensor(tap: CollectiveTap, host: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """``wait_tensor`` on a CUDA tensor: the current stream waits, between two events there; matched to the
    functional collective that made the tensor, as on the host (``tensor_key``)."""

    @functools.wraps(original)
    def wait_tensor(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if tap.compiling():
            return original(tensor, *args, **kwargs)
        timeline = tap.timeline
        if not tap.on or not tap.cuda_functional or timeline is None or getattr(tensor, "is_cpu", True):
            return host(tensor, *args, **kwargs)
        issued = tap.cuda_functional.pop(tensor_key(tensor), None)
        if issued is None:  # issued where the tap cannot see (an autograd variant's backward), or waited already
            return original(tensor, *args, **kwargs)
        kind, group, issue_key = issued
        key = timeline.begin()
        try:
            return original(tensor, *args, **kwargs)
        finally:
            timeline.end_wait(key, kind, group, issue_key)

    return wait_tensor


def wrap_fsdp_scope(tap: CollectiveTap, original: Callable[..., Any], kind: str) -> Callable[..., Any]:
    """An FSDP2 method that makes the compute stream wait: its waits are ``kind`` on its parameter group's group
    for it, or the collective their event belongs to (``fsdp_wait``: HSDP's all-reduce, a prefetched all-gather).

    A group of one rank issues no collective (FSDP2 copies instead): its waits are left untimed, not
    passed off as communication.
    """

    @functools.wraps(original)
    def scoped(owner: Any, *args: Any, **kwargs: Any) -> Any:
        if tap.compiling() or not tap.on:
            return original(owner, *args, **kwargs)
        param_group = param_group_of(owner)
        with tap.waits_for(kind, shared_group(param_group, kind), param_group):  # the innermost method's, nested
            return original(owner, *args, **kwargs)

    scoped.__gputop_original__ = original  # type: ignore[attr-defined]
    return scoped


def wrap_wait_event(tap: CollectiveTap, original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.cuda.Stream.wait_event``: timed only inside ``waits_for`` (FSDP2's waits), only on the compute
    stream (FSDP2's side streams wait on each other too: that is no one's exposed time); else straight through."""

    @functools.wraps(original)
    def wait_event(stream: Any, event: Any) -> Any:
        if tap.compiling():
            return original(stream, event)
        scope, timeline = tap.wait_scope, tap.timeline
        if scope is None or not tap.on or timeline is None:
            return original(stream, event)
        kind, group = fsdp_wait(scope, event)
        key = timeline.begin(stream, compute_only=True) if group is not None else 0
        if not key:
            return original(stream, event)
        try:
            return original(stream, event)
        finally:
            timeline.end_wait(key, kind, group)

    wait_event.__gputop_original__ = original  # type: ignore[attr-defined]
    return wait_event


def wrap_accelerator_stream(
    tap: CollectiveTap, original: Callable[..., Any], cuda_stream: Callable[..., Any]
) -> Callable[..., Any]:
    """``torch.accelerator.current_stream``: inside FSDP2's waits, the same stream as a ``torch.cuda.Stream``, whose
    ``wait_event`` is timed (``finalize_backward`` waits through it in 2.11 and later; ``torch.Stream`` is a C type,
    which cannot be wrapped); elsewhere straight through."""

    @functools.wraps(original)
    def current_stream(*args: Any, **kwargs: Any) -> Any:
        if tap.compiling() or tap.wait_scope is None or not tap.on:
            return original(*args, **kwargs)
        return cuda_stream(*args, **kwargs)

    current_stream.__gputop_original__ = original  # type: ignore[attr-defined]
    return current_stream
