"""The functional collectives (DTensor's, ``torch.distributed._functional_collectives``) on the host: timed,
numbered on their process group, and their ``wait_tensor`` marked while the training thread is in it.

A functional collective returns at once with an ``AsyncCollectiveTensor``; the training thread waits for it in
``wait_tensor`` when the result is first used.  Under tensor parallelism that wait is where a rank blocks when a
peer never issued the collective, so the wait says which one it is: the collective's number on its group, taken
from torch's count as it was issued (``collective_digests.record``), kept with the issue until the wait, and set
as the tap's ``waiting`` while the thread is in it (``collective_numbers.read_group`` sends it in a hang).

The group argument names a process group several ways (``(DeviceMesh, dim)``, a 1-D mesh, a group, its registered
name, a list of ranks); ``counts_for`` resolves it once per mesh dimension or group and keeps the answer, so a call
costs a dict lookup (resolving is ~1 µs).
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from gputop.reporter.clock import StepClock
from gputop.reporter.collective_calls import Where, on_cpu, tensor_bytes, tensor_key, waited_tensor
from gputop.reporter.collective_digests import SiteDigests, record
from gputop.reporter.collective_numbers import GroupCounts, process_group

RESOLVED_KEPT = 256  # group arguments resolved and kept; past it the cache starts again


class Numbering(Protocol):
    """What of the tap (``collectives.CollectiveTap``) numbering a functional collective reads and keeps; the CUDA
    wrappers' tap has it too."""

    numbers: dict[Any, GroupCounts]
    functional_groups: dict[Any, tuple[Any, GroupCounts | None]]
    functional_shapes: dict[int, tuple[Any, int]]
    sites: SiteDigests

    def count(self, group: Any) -> GroupCounts: ...


class FunctionalTap(Numbering, Protocol):
    """What of the tap the host's functional wrappers read and keep."""

    on: bool
    depth: int
    errors: int
    cuda_calls: int
    clock: StepClock
    records: deque[Any]
    compiling: Callable[[], bool]
    inside: GroupCounts | None
    functional: dict[int, Any]  # tensor_key -> collectives.Issued

    def pend(self, key: int, issued: Any, pending: dict[int, Any] | None = None) -> None: ...

    def wait_through(self, issued: Any, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...


def counts_for(tap: Numbering, group: Any) -> GroupCounts | None:
    """The counts of the process group a functional collective's ``group`` argument names (None: unresolved).

    Kept by what names the group: the mesh and dimension of ``(mesh, dim)`` (a new tuple at each call), the
    object itself otherwise, held with the answer so that a reused id is never taken for it."""
    key: Any
    if isinstance(group, tuple) and len(group) == 2:
        anchor, key = group[0], (id(group[0]), group[1])
    elif isinstance(group, list):
        anchor, key = None, tuple(group)
    else:
        anchor, key = group, (id(group) if not isinstance(group, str) else group)
    kept = tap.functional_groups.get(key)
    if kept is not None and kept[0] is anchor:
        return kept[1]
    resolved = process_group(group)
    counts = None if resolved is None else tap.numbers.get(resolved) or tap.count(resolved)
    if len(tap.functional_groups) >= RESOLVED_KEPT:
        tap.functional_groups.clear()
    tap.functional_groups[key] = (anchor, counts)
    return counts


def issue(tap: Numbering, counts: GroupCounts | None, kind: str, tensor: Any, nbytes: int, depth: int) -> int | None:
    """Count a functional collective of ``nbytes`` as issued on its group, before the call: its number (None: not
    numbered)."""
    if counts is None:
        return None
    counts.issued += 1
    counts.kind, counts.nbytes = kind, nbytes
    return record(counts, tap.sites, tap.functional_shapes, kind, getattr(tensor, "dtype", None), nbytes, depth + 1)


def queued(tap: Numbering, group: Any, kind: str, tensor: Any) -> None:
    """A functional collective on CUDA tensors, numbered on its group as it is queued, and completed then (its
    wait is on the stream): the CUDA wrappers' (``collective_cuda.wrap_functional``)."""
    counts = counts_for(tap, group)
    issue(tap, counts, kind, tensor, tensor_bytes(tensor), 3)
    if counts is not None:
        counts.completed += 1


def wrap_functional(tap: FunctionalTap, original: Callable[..., Any], kind: str, where: Where) -> Callable[..., Any]:
    perf = time.perf_counter

    @functools.wraps(original)
    def functional(*args: Any, **kwargs: Any) -> Any:
        if tap.compiling() or not tap.on or tap.depth:
            return original(*args, **kwargs)
        tap.depth = 1
        counts = number = None
        try:
            tensor, group = where.tensor(args, kwargs), where.group(args, kwargs)
            nbytes, cpu = tensor_bytes(tensor), on_cpu(tensor)
            counts = counts_for(tap, group)
            number = issue(tap, counts, kind, tensor, nbytes, 2)
            tap.inside = counts  # an all-gather on another dimension than 0 is waited for inside the call
        except Exception:
            tap.errors += 1
        try:
            start = perf()
            result = original(*args, **kwargs)
            end = perf()
        finally:
            tap.depth = 0
            tap.inside = None
        try:
            waited = waited_tensor(result)
            if not cpu or waited is None:
                if counts is not None:
                    counts.completed += 1
                if not cpu:
                    tap.cuda_calls += 1
                    tap.records.append((kind, group, nbytes, None, None, end))
                else:
                    tap.clock.comm_exposed_s += end - start
                    tap.records.append((kind, group, nbytes, end - start, end - start, end))
            else:  # waited for when first used, through wait_tensor on it or a view of it, matched by that tensor
                tap.clock.comm_exposed_s += end - start
                tap.pend(tensor_key(waited), (kind, group, nbytes, start, end - start, counts, number), tap.functional)
        except Exception:
            tap.errors += 1
        return result

    functional.__gputop_original__ = original  # type: ignore[attr-defined]
    return functional


def wrap_wait_tensor(tap: FunctionalTap, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wait_tensor(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if tap.compiling() or not tap.on or not tap.functional:
            return original(tensor, *args, **kwargs)
        try:  # None: issued where the tap cannot see (an autograd variant's backward, in C++), or waited already
            issued = tap.functional.pop(tensor_key(tensor), None)
        except Exception:
            tap.errors, issued = tap.errors + 1, None
        return tap.wait_through(issued, original, tensor, *args, **kwargs)

    return wait_tensor
