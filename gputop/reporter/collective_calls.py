"""torch.distributed's collectives as the collective tap sees them: which functions it wraps and their kind, where
each takes the tensor it sends and the process group, the tensor's size, and whether the host's clock can time it.

Read by the tap (``collectives.py``) and its CUDA wrappers (``collective_cuda.py``) when they install and on every
call they time.  Nothing here imports torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# torch.distributed's collectives, each with its kind and the argument whose size is what the rank sends: every
# name some release from 2.4 on calls them by.  The same collective has had several: FSDP2 calls
# ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` up to 2.12, which 2.13 made aliases of its new
# ``all_gather_single`` and ``reduce_scatter_single``; DeepSpeed and Megatron call the older ``_all_gather_base`` and
# ``_reduce_scatter_base``.  All are wrapped: an alias's wrapper counts the call, and the leaf's, called inside it,
# passes through (the tap's depth), so a collective is counted once whichever name it came by.  Each is wrapped on
# ``torch.distributed`` (FSDP2, user code: ``dist.<name>`` at call time) and on
# ``torch.distributed.distributed_c10d`` (the aliases' and deepspeed.comm's cached calls end there).
# tests/unit/test_torch_drift.py reads the installed torch's FSDP2 and DTensor for a collective missing here.
DIST_COLLECTIVES: dict[str, tuple[str, str | None]] = {
    "all_reduce": ("all_reduce", "tensor"),
    "all_reduce_coalesced": ("all_reduce", "tensors"),
    "all_gather": ("all_gather", "tensor"),
    "all_gather_single": ("all_gather", "input_tensor"),
    "all_gather_into_tensor": ("all_gather", "input_tensor"),
    "_all_gather_base": ("all_gather", "input_tensor"),
    "all_gather_coalesced": ("all_gather", "input_tensor_list"),
    "reduce_scatter": ("reduce_scatter", "input_list"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "_reduce_scatter_base": ("reduce_scatter", "input"),
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
    "monitored_barrier": ("barrier", None),
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
# Collectives some stack calls that the tap reaches through another: each calls a wrapped one by its module's name.
THROUGH_ANOTHER: dict[str, str] = {
    "batch_isend_irecv": "each of its P2POps calls the isend or irecv it was made with (dist.isend: the wrapper); "
    "on CUDA it is wrapped too, for the one work NCCL coalesces the batch into (collective_cuda.wrap_batch_p2p)",
    "permute_tensor": "calls funcol.all_to_all_single",
    "all_gather_inplace": "calls funcol.all_gather_tensor",
}
# Modules that bound a c10d collective at import (``from … import broadcast``): DTensor's mesh helpers.
IMPORTED_AT: tuple[tuple[str, str], ...] = (
    ("torch.distributed.tensor._collective_utils", "broadcast"),
    ("torch.distributed.tensor._collective_utils", "scatter"),
)
# FSDP2's package, where each torch has it: torch.distributed.fsdp._fully_shard from 2.6,
# torch.distributed._composable.fsdp in 2.4 and 2.5 (before 2.4 there is no FSDP2).
FSDP_PACKAGES = ("torch.distributed.fsdp._fully_shard", "torch.distributed._composable.fsdp")
# The methods inside which FSDP2 makes the compute stream wait for its collectives, with
# ``current_stream().wait_event(event)`` (``Work.wait()`` for an asynchronous all-gather, which the tap times
# anyway): (module, class, method, the kind its waits are for).  The all-gather's before a block's forward and
# backward (``wait_for_unshard``, which calls ``foreach_all_gather_copy_out``), the previous reduce-scatter's in
# ``post_backward`` (a bounded number in flight) and every last one's at the end of backward, before the
# optimizer: in ``finalize_backward`` and the root's final callback.  tests/unit/test_torch_drift.py fails on a
# wait in the installed torch's FSDP2 outside these.
FSDP_WAITS = (
    ("_fsdp_param_group", "FSDPParamGroup", "wait_for_unshard", "all_gather"),
    ("_fsdp_param_group", "FSDPParamGroup", "post_backward", "reduce_scatter"),
    ("_fsdp_param_group", "FSDPParamGroup", "finalize_backward", "reduce_scatter"),
    ("_fsdp_state", "FSDPState", "_root_post_backward_final_callback", "reduce_scatter"),
)
# An FSDPParamGroup's process group for each kind of collective.
FSDP_GROUPS = {
    "all_gather": "_all_gather_process_group",
    "reduce_scatter": "_reduce_scatter_process_group",
    "all_reduce": "_all_reduce_process_group",
}
# Events an FSDPParamGroup waits for inside one of those methods that belong to another collective than the
# method's: (where the event is, its kind).  HSDP's all-reduce across replicas, waited in
# ``_wait_for_post_backward`` beside the reduce-scatter; and an unshard prefetched and never used, waited in
# ``finalize_backward``.  Told by identity, so a wait is booked where its event came from.
FSDP_EVENTS = (
    (("_all_reduce_state", "event"), "all_reduce"),
    (("_all_gather_result", "all_gather_event"), "all_gather"),
)
# Asynchronous collectives issued and not yet waited for: a job that never waits in Python (or waits in
# C++) must not grow this without bound.  FSDP2 keeps a few in flight; a thousand is far past any.
MAX_PENDING = 1024


# Inside an FSDP2 method that makes the compute stream wait (or the GPU check's known delay): the kind and group
# of its waits, and the FSDPParamGroup whose events may name another (``fsdp_wait``); None outside.
WaitScope = tuple[str, Any, Any]


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


def sent(where: Where, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The tensor a collective sends, or None where it cannot be told (then it is timed as on the host)."""
    try:
        return where.tensor(args, kwargs)
    except Exception:
        return None


def param_group_of(owner: Any) -> Any:
    """The FSDPParamGroup whose groups and events a wait scope reads: the owner itself, or for an FSDPState (the
    root's final callback) the first parameter group of any state in its tree; None where there is none."""
    if hasattr(owner, "_fsdp_param_groups"):
        for state in getattr(getattr(owner, "_state_ctx", None), "all_states", None) or [owner]:
            for param_group in getattr(state, "_fsdp_param_groups", None) or ():
                return param_group
        return None
    return owner


def shared_group(param_group: Any, kind: str) -> Any:
    """An FSDP2 parameter group's process group for a kind of collective, where it has more than one rank; else
    None (a one-rank group issues no collective: FSDP2 copies instead)."""
    try:
        group = getattr(param_group, FSDP_GROUPS[kind])
        return group if group.size() > 1 else None
    except Exception:
        return None


def fsdp_wait(scope: WaitScope, event: Any) -> tuple[str, Any]:
    """The collective a wait inside FSDP2's scope is for, (kind, group): the one its event belongs to
    (``FSDP_EVENTS``), else the method's own.  A group of one rank is None: its wait is no communication."""
    kind, group, owner = scope
    if owner is not None:
        for path, other_kind in FSDP_EVENTS:
            held: Any = owner
            for name in path:
                held = getattr(held, name, None)
            if held is not None and held is event:
                return other_kind, shared_group(owner, other_kind)
    return kind, group


def waited_tensor(result: Any) -> Any:
    """The tensor a functional collective's result will be waited on with ``wait_tensor``: an
    ``AsyncCollectiveTensor``'s own; None where the result is a plain tensor (waited inside the call already:
    an all-gather on another dimension than 0, or traced)."""
    return getattr(result, "elem", None)


def tensor_key(tensor: Any) -> int:
    """What a functional collective's wait is matched to its issue by: where the tensor's memory is, so that a
    view of the result is the same (a view of an ``AsyncCollectiveTensor`` waits on a view of its tensor, made
    below autograd: no ``_base`` to follow).  0.16 µs; the object's identity where it has no memory."""
    try:
        return tensor.untyped_storage().data_ptr() or id(tensor)
    except Exception:
        return id(tensor)


def on_cpu(value: Any) -> bool:
    """Whether the host's clock times this collective: its tensor is in host memory (gloo, or MPI)."""
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return value is None or bool(getattr(value, "is_cpu", True))
