"""The installed torch's FSDP2 and DTensor call no collective the tap does not wrap, read from torch's own source.

Each release has renamed some (FSDP2 called ``all_gather_into_tensor`` up to 2.12 and ``all_gather_single`` in
2.13): a name the tap misses leaves a stack's communication unread with nothing to say so.  Read at test time, so
the day the pinned torch moves, a new name fails here rather than on a user's job.
"""

from __future__ import annotations

import pytest

from gputop.reporter.collective_calls import DIST_COLLECTIVES, FSDP_WAITS, FUNCTIONAL_COLLECTIVES, THROUGH_ANOTHER
from tests.support.torch_calls import FUNCOL, calls_in, collectives_called, compute_stream_waits

torch = pytest.importorskip("torch")


def test_every_collective_fsdp2_and_dtensor_call_is_wrapped_by_the_tap() -> None:
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.distributed_c10d as c10d

    called = collectives_called(torch, c10d, funcol)
    assert called["FSDP2"]["torch.distributed"], called  # the reading found FSDP2's all-gathers at all
    wrapped = {"torch.distributed": set(DIST_COLLECTIVES), FUNCOL: set(FUNCTIONAL_COLLECTIVES)}
    missed = {
        f"{stack}: {module}.{name}"
        for stack, by_module in called.items()
        for module, names in by_module.items()
        for name in names - wrapped[module] - set(THROUGH_ANOTHER)
    }
    assert not missed, f"torch {torch.__version__} calls collectives the tap does not wrap: {sorted(missed)}"


# FSDP2's functions that make the compute stream wait outside the methods the tap scopes, and why that is right.
WAITS_ELSEWHERE = {
    ("_fsdp_collectives", "foreach_all_gather_copy_out"): "called by wait_for_unshard, inside its scope",
    ("_fsdp_param_group", "_wait_for_post_backward"): "called by finalize_backward, inside its scope",
    ("_fsdp_param_group", "_reset_iter_state"): "recovery after an exception in a step (2.13): no step's wait",
    ("_fsdp_state", "_reset_iter_state"): "the same, from the root",
}


def test_every_wait_fsdp2_makes_the_compute_stream_do_is_in_a_method_the_tap_scopes() -> None:
    """A wait outside them is the compute stream idling for a collective that reads as compute: the last
    reduce-scatter's, in the root's final callback, was so on every torch until it was read here."""
    sites = compute_stream_waits(torch)
    assert ("_fsdp_param_group", "post_backward") in sites, sites  # the reading found FSDP2's waits at all
    scoped = {(module, method) for module, _, method, _ in FSDP_WAITS}
    unscoped = sites - scoped - set(WAITS_ELSEWHERE)
    assert not unscoped, f"torch {torch.__version__}'s FSDP2 waits where the tap does not look: {sorted(unscoped)}"


def test_the_reading_finds_a_collective_however_the_module_imported_it() -> None:
    source = """
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed import distributed_c10d as c10d
from torch.distributed.distributed_c10d import all_gather_into_tensor as gather
import torch

def f(x, group):
    dist.all_reduce(x)
    funcol.all_gather_tensor(x, 0, group)
    c10d._reduce_scatter_base(x, x)
    gather(x, x)
    torch.distributed.broadcast(x, 0)
    dist.get_rank()
"""
    assert calls_in(source) == {
        ("torch.distributed", "all_reduce"),
        (FUNCOL, "all_gather_tensor"),
        ("torch.distributed", "_reduce_scatter_base"),
        ("torch.distributed", "all_gather_into_tensor"),
        ("torch.distributed", "broadcast"),
        ("torch.distributed", "get_rank"),
    }
