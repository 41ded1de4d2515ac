"""The window's collectives by kind and process group, from the collective tap (reporter thread).

The tap (``gputop.reporter.collectives``) records each collective on the training thread with the
process group object it was given; here the records are drained once a window, each group named
by its DeviceMesh dimension where it has one (``dp``, ``tp``), else ``world`` or ``pg <name>``, and
added up kind by kind and group by group into ``Window.collectives``.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from gputop.combine import merge_collectives
from gputop.protocol import COLLECTIVES_KEPT, CollectiveTimes
from gputop.protocol.run import MAX_DIGEST_SITES
from gputop.reporter.collective_digests import take_digests
from gputop.reporter.collective_numbers import default_group, process_group
from gputop.reporter.collectives import CollectiveTap


class CollectiveProbe:
    """The window's collectives by kind and group, from the tap (reporter thread)."""

    name = "collectives"

    def __init__(self, tap: CollectiveTap) -> None:
        self.tap = tap
        self.not_measured: str | None = None
        self._names: dict[int, tuple[Any, str]] = {}  # id(group): (the group, kept alive; its name)
        self._sizes: dict[int, tuple[Any, int | None]] = {}  # id(group): (the group, kept alive; its ranks)
        self._until_s = 0.0  # the end of the last step whose collectives were drained
        tap.name_group = self.group_name  # the numbers sent while stuck name each group as the windows do

    def read(self, marks: Any) -> dict[str, Any]:
        """The collectives of the window's steps: those that returned by its last step mark (all of them in a job
        that marks no steps); a window without a step mark takes none, they belong to the step still running."""
        if marks:
            self._until_s = marks[-1][0]
        until_s = self._until_s if self.tap.clock.stepped else math.inf
        found = [
            CollectiveTimes(kind, self.group_name(group), 1, nbytes, busy_s,
                            busy_s if exposed_s is None and busy_s is not None else exposed_s, self.group_size(group))
            for kind, group, nbytes, busy_s, exposed_s, _ in self.tap.drain(until_s)
        ]  # fmt: skip
        if self.tap.cuda_calls:
            self.not_measured = CUDA_NOT_TIMED
        out = self._digests()
        if found:
            out["collectives"] = merge_collectives([found])[:COLLECTIVES_KEPT]
        return out

    def _digests(self) -> dict[str, Any]:
        """Each group's collective digests since the last window, and the calls first seen (collective_digests)."""
        taken = []
        for counts in list({id(c): c for c in list(self.tap.numbers.values())}.values())[:16]:
            digests = take_digests(counts.digests, self.group_name(counts.group))
            if digests is not None:
                taken.append(digests)
        new = self.tap.sites.new
        sites = [new.popleft() for _ in range(min(len(new), MAX_DIGEST_SITES))]
        return {"digests": tuple(taken)} | ({"digest_sites": tuple(sites)} if sites else {}) if taken or sites else {}

    def learn_meshes(self, model: Any, *, looked_at: int = 64) -> None:
        """Name each group of the meshes the model's sharded parameters live on by its dimension (training thread).

        A dimension that spans every rank reuses the default group, which no description ties to the
        mesh: without this a 1-D FSDP2 mesh ("dp",) would read "world".
        """
        for i, parameter in enumerate(model.parameters()):
            if i >= looked_at:
                return
            mesh = getattr(parameter, "device_mesh", None)
            names = getattr(mesh, "mesh_dim_names", None) or ()
            for dim, dim_name in enumerate(names):
                group = mesh.get_group(dim)  # type: ignore[union-attr]
                self._names[id(group)] = (group, str(dim_name)[:64])
                if group is default_group():
                    self._names[id(None)] = (None, str(dim_name)[:64])

    def group_name(self, group: Any) -> str:
        """A process group's name on screen: its DeviceMesh dimension where it has one.

        One group has one name however a call reaches it: ``None`` and the default group object (FSDP2's
        all-gathers on a 1-D mesh over every rank), ``(mesh, 0)`` (DTensor's functional collectives) and the
        group's registered name (a string, as compiled code passes it) all name the default group.
        """
        group = resolve_group(group)
        known = self._names.get(id(group))
        if known is not None and known[0] is group:
            return known[1]
        # Asked once a group (the names are kept): ``learn_meshes`` names the default group's object and None alike.
        if group is None or group is default_group():
            name = self._names.get(id(None), (None, "world"))[1]
        else:
            name = describe_group(group)
        self._names[id(group)] = (group, name)
        return name

    def group_size(self, group: Any) -> int | None:
        """How many ranks a process group has (None: the default group's, as for its name), asked once a group."""
        known = self._sizes.get(id(group))
        if known is not None and known[0] is group:
            return known[1]
        size = group_size(resolve_group(group))
        self._sizes[id(group)] = (group, size)
        return size


def group_size(group: Any) -> int | None:
    """A process group's size; the world's for None; None where it cannot be read (a destroyed group)."""
    try:
        if group is None:
            dist = sys.modules.get("torch.distributed")
            return int(dist.get_world_size()) if dist is not None else None
        return int(group.size())
    except Exception:
        return None


CUDA_NOT_TIMED = (
    "collectives on CUDA tensors are counted with their bytes; their times need CUDA events on the model's one GPU "
    "outside DDP (cuda_phases says why not here), so they are N/A"
)


def resolve_group(group: Any) -> Any:
    """The process group object behind what a collective was given (``collective_numbers.process_group``:
    ``(DeviceMesh, dim)`` and a 1-D mesh as DTensor passes them, a group's registered name, a list of ranks); the
    value itself where it cannot be resolved.  One resolution for the names and for the numbers, so a group reached
    as ``(mesh, 0)`` is named as the same group reached as itself ("world", not "mesh dim 0")."""
    if group is None:
        return None
    resolved = process_group(group)
    return group if resolved is None else resolved


def describe_group(group: Any) -> str:
    """``dp``/``tp``/… for a DeviceMesh dimension's group, ``world`` for the default one, else ``pg <name>``."""
    try:
        if isinstance(group, tuple) and len(group) == 2:  # (DeviceMesh, dim), as funcol takes it
            mesh, dim = group
            names = getattr(mesh, "mesh_dim_names", None)
            return str(names[dim]) if names else f"mesh dim {dim}"
        if isinstance(group, (list, tuple)):
            return f"ranks {','.join(map(str, group))}"[:64]
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        if isinstance(group, str) and c10d is not None:
            group = c10d._resolve_process_group(group)
        if group is default_group() or getattr(group, "group_desc", None) == "default_pg":  # (read after teardown)
            return "world"
        desc = str(getattr(group, "group_desc", "") or "")
        if desc.startswith("mesh_"):
            return desc[len("mesh_") :][:64]
        if desc in ("", "undefined"):  # new_group() without a description (DeepSpeed's data-parallel group)
            return f"pg {getattr(group, 'group_name', '?')}"[:64]
        return desc[:64]
    except Exception:
        return "unknown"
