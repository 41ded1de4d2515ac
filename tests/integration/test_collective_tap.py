"""The collective tap on a real one-rank gloo process group: what it records, and what it leaves alone."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from gputop.address import Address
from gputop.collect.server import Collector
from gputop.collect.store import Store
from gputop.model.snapshot import DONE
from gputop.reporter.clock import StepClock
from gputop.reporter.collectives import CollectiveTap
from gputop.reporter.probes.collectives import CollectiveProbe
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import run_script

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")


@pytest.fixture
def dist() -> Iterator[Any]:
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


@pytest.fixture
def tap(dist: Any) -> Iterator[CollectiveTap]:
    # The tap wraps the functional collectives only where their module is imported when it installs, as it is by
    # the time a DTensor or FSDP2 model is watched; imported here, whatever ran before in this worker.
    import torch.distributed._functional_collectives  # noqa: F401

    tap = CollectiveTap(StepClock())
    tap.install()
    try:
        yield tap
    finally:
        tap.uninstall()


def test_blocking_and_asynchronous_collectives_are_recorded_with_their_kind_group_and_bytes(
    dist: Any, tap: CollectiveTap
) -> None:
    import torch

    tap.on = True
    x = torch.ones(256)  # 1 KiB
    dist.all_reduce(x)
    work = dist.all_gather_into_tensor(torch.empty(256), x, async_op=True)  # an alias: counted once, as all_gather
    work.wait()
    dist.broadcast(x, src=0)
    collectives = CollectiveProbe(tap).read([])["collectives"]

    by_kind = {c.kind: c for c in collectives}
    assert set(by_kind) == {"all_reduce", "all_gather", "broadcast"}
    for c in collectives:
        assert (c.group, c.calls, c.bytes) == ("world", 1, 1024)
        assert c.busy_s is not None and c.exposed_s is not None and 0 < c.exposed_s <= c.busy_s + 1e-9
    assert tap.clock.comm_exposed_s > 0
    assert tap.pending == {} and tap.errors == 0


def test_each_group_counts_its_collectives_issued_and_completed_beside_torchs_own_number(
    dist: Any, tap: CollectiveTap
) -> None:
    """Three blocking all-reduces, one asynchronous all-gather waited for, and a barrier on the default group,
    named or not: one group, 5 issued and 5 completed, the newest a barrier; torch's count says 5 too."""
    import torch

    from gputop.reporter.collective_numbers import group_calls

    probe = CollectiveProbe(tap)
    tap.on = True
    x = torch.ones(64)  # 256 bytes
    for group in (None, dist.group.WORLD, None):
        dist.all_reduce(x, group=group)
    dist.all_gather_into_tensor(torch.empty(64), x, async_op=True).wait()
    dist.barrier()
    (world,) = group_calls(tap, probe.group_name)
    assert (world.group, world.seq, world.issued, world.completed, world.kind) == ("world", 5, 5, 5, "barrier")
    assert not world.inside and tap.inside is None and tap.errors == 0
    dist.all_reduce(x)
    tap.inside = tap.numbers[None]  # as while blocked in it
    (world,) = group_calls(tap, probe.group_name)
    assert (world.seq, world.kind, world.bytes, world.inside) == (6, "all_reduce", 256, True)


def test_a_collective_goes_in_the_window_of_the_step_it_ended_not_the_one_before(dist: Any, tap: CollectiveTap) -> None:
    """A rank that waits in its own all-reduce after a step's mark spends that time in the next step: the window
    that closes before the next mark leaves the collective to the window that holds that step (issue #35: a
    waiting rank's 1.7-s all-reduce in one window and its long step in the next read as a stopping rank)."""
    import torch

    tap.on = True
    clock, probe = tap.clock, CollectiveProbe(tap)
    clock.mark_step()  # step 1 ends
    dist.all_reduce(torch.ones(4))  # at the end of step 1, as a loss logged is: in step 2's time
    assert "collectives" not in probe.read(clock.drain())  # the window of step 1 closes now: nothing of its own
    dist.all_reduce(torch.ones(4))
    clock.mark_step()  # step 2 ends
    (step_2,) = probe.read(clock.drain())["collectives"]
    assert (step_2.kind, step_2.calls) == ("all_reduce", 2)
    dist.barrier()  # a window with no step mark takes none: they belong to the step still running
    assert "collectives" not in probe.read(clock.drain())
    clock.mark_step()
    assert [c.kind for c in probe.read(clock.drain())["collectives"]] == ["barrier"]


def test_a_job_that_marks_no_steps_gets_every_collective_in_the_window_it_ended(dist: Any, tap: CollectiveTap) -> None:
    import torch

    tap.on = True
    dist.all_reduce(torch.ones(4))
    (only,) = CollectiveProbe(tap).read([])["collectives"]
    assert only.calls == 1


def test_nothing_is_recorded_while_no_collector_listens_and_uninstall_puts_the_originals_back(dist: Any) -> None:
    import torch
    import torch.distributed.distributed_c10d as c10d

    original = dist.all_reduce
    tap = CollectiveTap(StepClock())
    assert "all_reduce" in tap.install() and dist.all_reduce is not original and c10d.all_reduce is dist.all_reduce
    dist.all_reduce(torch.ones(4))  # tap.on is False until the reporter thread sees a collector
    assert not tap.records and tap.clock.comm_exposed_s == 0.0
    tap.uninstall()
    assert dist.all_reduce is original and c10d.all_reduce is original


def test_a_users_error_in_a_collective_reaches_the_user_unchanged(dist: Any, tap: CollectiveTap) -> None:
    tap.on = True
    with pytest.raises((TypeError, RuntimeError, ValueError)) as raised:
        dist.all_reduce("not a tensor")
    assert "gputop" not in str(raised.value)
    assert tap.errors == 0 and not tap.records


def test_a_compiled_function_that_all_reduces_still_compiles_with_the_tap_in_place(
    dist: Any, tap: CollectiveTap
) -> None:
    import torch

    tap.on = True

    def step(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        dist.all_reduce(y)
        return y + 1

    compiled = torch.compile(step, fullgraph=True, backend="eager")  # fullgraph: a graph break would raise
    assert torch.equal(compiled(torch.ones(8)), torch.full((8,), 3.0))


def test_mesh_dimensions_name_their_groups(dist: Any, tap: CollectiveTap) -> None:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    model = torch.nn.Linear(4, 4)
    model.weight = torch.nn.Parameter(distribute_tensor(model.weight.detach(), mesh, [Shard(0)]))
    probe = CollectiveProbe(tap)
    probe.learn_meshes(model)
    tap.on = True
    dist.all_reduce(torch.ones(4))  # the mesh's one dimension spans the world: it is the default group
    (collective,) = probe.read([])["collectives"]
    assert collective.group == "dp"
    assert "torch.distributed.tensor" in sys.modules


def test_the_default_group_has_one_name_however_a_collective_reaches_it(dist: Any, tap: CollectiveTap) -> None:
    """pytorch/examples' FSDP2 example shards on an unnamed 1-D mesh: FSDP2 all-gathers on the default group's
    object, DTensor's functional collectives take ``(mesh, 0)``, a script passes nothing.  One group, one row."""
    import torch
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (1,))
    probe = CollectiveProbe(tap)
    tap.on = True
    dist.all_reduce(torch.ones(4))
    dist.all_reduce(torch.ones(4), group=mesh.get_group(0))
    funcol.wait_tensor(funcol.all_reduce(torch.ones(4), "sum", (mesh, 0)))
    funcol.wait_tensor(funcol.all_reduce(torch.ones(4), "sum", mesh.get_group(0).group_name))
    (collective,) = probe.read([])["collectives"]
    assert (collective.kind, collective.group, collective.calls) == ("all_reduce", "world", 4)


def test_a_functional_collectives_wait_is_matched_to_the_collective_that_made_its_tensor(
    dist: Any, tap: CollectiveTap
) -> None:
    """DTensor waits where a result is first used: in any order, and through a view of it.  A wait for a tensor no
    collective the tap saw made (an autograd variant's backward issues in C++) takes nothing of another's."""
    import torch
    import torch.distributed._functional_collectives as funcol

    tap.on = True
    small = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)  # 16 B
    large = funcol.all_gather_tensor(torch.ones(256), 0, dist.group.WORLD)  # 1 KiB
    funcol.wait_tensor(torch.ones(4))  # no collective's
    torch.add(large.view(16, 16), 1)  # the later one first, through a view
    torch.add(small, 1)
    assert [(kind, nbytes) for kind, _, nbytes, *_ in tap.records] == [("all_gather", 1024), ("all_reduce", 16)]
    assert all(r[4] is not None for r in tap.records) and tap.functional == {} and tap.errors == 0


def test_a_functional_collective_is_numbered_on_its_group_and_its_wait_says_which_one_the_thread_is_in(
    dist: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DTensor's collectives name their group as ``(mesh, dim)``; they count on that group as every collective
    does, and while the training thread waits for one in ``wait_tensor`` (where a tensor-parallel rank blocks when a
    peer never issued it) its group says that one's number, though a newer one was issued since."""
    import torch
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh

    from gputop.reporter.collective_numbers import group_calls

    seen = []
    real_wait = funcol.wait_tensor

    def wait_and_look(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(group_calls(tap, probe.group_name))  # what the reporter thread reads while the thread waits
        return real_wait(tensor, *args, **kwargs)

    monkeypatch.setattr(funcol, "wait_tensor", wait_and_look)
    tap = CollectiveTap(StepClock())
    tap.install()
    try:
        probe, tap.on = CollectiveProbe(tap), True
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
        dist.all_reduce(torch.ones(4))  # #1 on the world's group, which the 1-rank mesh's is
        gathered = funcol.all_gather_tensor(torch.ones(256), 0, (mesh, 0))  # #2, 1 KiB
        reduced = funcol.all_reduce(torch.ones(4), "sum", (mesh, 0))  # #3
        torch.add(gathered, 1)  # waits for #2
        torch.add(reduced, 1)  # then #3
        (world,) = group_calls(tap, probe.group_name)
    finally:
        tap.uninstall()
    assert (world.seq, world.issued, world.completed, world.waits) == (3, 3, 3, None), world
    waits = [(g.seq, g.waits, g.waits_kind, g.waits_bytes, g.inside) for (g,) in seen]
    assert waits == [(3, 2, "all_gather", 1024, False), (3, 3, "all_reduce", 16, False)], seen
    assert tap.errors == 0


def test_an_fsdp2_mixed_precision_policy_is_read_as_the_precision_the_model_computes_in(dist: Any) -> None:
    """FSDP2 keeps fp32 shards and casts them for compute: MixedPrecisionPolicy is mixed precision on."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from gputop.reporter.facts import model_facts

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    plain = fully_shard(torch.nn.Linear(4, 4), mesh=mesh)
    mixed = fully_shard(torch.nn.Linear(4, 4), mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    assert model_facts(plain)["param_dtype"] == "float32"
    assert model_facts(mixed)["param_dtype"] == "bfloat16"


def test_collectives_are_timed_from_the_tick_the_collector_is_reached_not_a_window_later() -> None:
    """A one-rank job that all-reduces 20 times between 0.5 and ~0.9 s, under the 1-s default window: the
    connection is made within the first ticks, and its collectives must be in its only window, the exit
    flush. The tap was switched on at the tick after the connection, which, connected and idle, is the
    next window's: a job's first second (and a second after each reconnection) went untimed."""
    collector = Collector(Store(), Address(port=0))
    collector.start()
    try:
        done = run_script(
            """
            import os, time
            import torch, torch.distributed as dist
            import gputop
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            gputop.watch(torch.nn.Linear(4, 4))  # a watched model's process group gets the tap
            time.sleep(0.5)  # connected by now: the reporter ticks every 0.25 s until it is
            for _ in range(20):
                dist.all_reduce(torch.ones(1024))
                time.sleep(0.02)
                gputop.step()
            print("steps", 20)
            """,
            collector.address.port,
            GPUTOP_WINDOW_S="1",
        )
        assert done.returncode == 0 and "steps 20" in done.stdout, done.stderr[-2000:]
        assert wait_for(lambda: [v.status for v in snapshot_of(collector).all_ranks()] == [DONE], timeout_s=30)
        (view,) = snapshot_of(collector).all_ranks()
    finally:
        collector.stop()
    calls = sum(c.calls for w in view.windows for c in w.collectives if c.kind == "all_reduce")
    seen = [(w.steps, [(c.kind, c.group, c.calls) for c in w.collectives]) for w in view.windows]
    said = f"{len(view.windows)} window(s) of (steps, collectives): {seen}"
    assert calls == 20, said


def test_each_collective_is_digested_at_torchs_own_number_so_ranks_that_connected_apart_meet(
    dist: Any, tap: CollectiveTap
) -> None:
    """Ranks connect to the collector at different moments: numbered by the tap from then, their digests would be
    compared one collective apart.  torch's number is the same on every rank for the same exchange."""
    import torch

    def all_reduce(tensor: Any) -> None:
        dist.all_reduce(tensor)  # one call site

    all_reduce(torch.ones(4))  # no collector yet: nothing read, nothing kept
    all_reduce(torch.ones(4))
    tap.on = True
    all_reduce(torch.ones(4))
    all_reduce(torch.ones(4, dtype=torch.int32))
    read = CollectiveProbe(tap).read([])
    ((world),) = read["digests"]
    (third, float_digest), (fourth, int_digest) = world.digests()
    assert (world.group, third, fourth) == ("world", 3, 4) and float_digest != int_digest
    assert {(c.dtype, c.digest) for c in read["digest_sites"]} == {("float32", float_digest), ("int32", int_digest)}
    assert "digests" not in CollectiveProbe(tap).read([])  # taken once
