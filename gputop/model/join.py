"""Which rank runs on which GPU: the join the TUI, the report and the diagnosis share.

The key is the device UUID each rank reports in its hello (from
``torch.cuda.get_device_properties(i).uuid``) against the UUID NVML gives each
GPU or MIG instance.  A CUDA index is not a key: ``CUDA_VISIBLE_DEVICES`` and
MIG renumber devices per process, so index 0 in a rank is rarely NVML's 0.  A
PID is only the fallback for a rank that sent no UUID, because PIDs differ
between a container and the host NVML sees.

Pure: a snapshot in, assignments out; no NVML, no psutil.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gputop.model.samples import GpuProcess, GpuReading, HostSample
from gputop.model.snapshot import RankView, Snapshot

_UUID_PREFIXES = ("gpu-", "mig-")


@dataclass(frozen=True)
class GpuAssignment:
    """One GPU (or MIG instance), the ranks that report it as theirs, and who else is on it."""

    gpu: GpuReading
    ranks: tuple[RankView, ...]  # hello.device_uuid matches gpu.uuid (PID fallback for a rank with no UUID)
    unobserved: tuple[GpuProcess, ...]  # on this GPU, neither a rank's process nor one of its children


def normalize_uuid(uuid: str | None) -> str:
    """A device UUID in one spelling: lower case, no ``GPU-``/``MIG-`` prefix, no dashes.

    torch and NVML print the same 16 bytes differently (with or without the
    ``GPU-`` prefix, in either case); this makes them compare equal.  Returns
    "" for a missing UUID, which matches nothing.
    """
    if not uuid:
        return ""
    text = uuid.strip().lower()
    while text.startswith(_UUID_PREFIXES):
        text = text[4:]
    return text.replace("-", "")


def rank_gpu_uuids(rank: RankView) -> tuple[str, ...]:
    """Every GPU a rank computes on, normalized, its own device first (several under nn.DataParallel)."""
    first = normalize_uuid(rank.hello.device_uuid)
    rest = [normalize_uuid(u) for u in rank.hello.device_uuids or ()]
    return tuple(dict.fromkeys(u for u in (first, *rest) if u))


def child_pids_by_rank_pid(host: HostSample | None) -> dict[int, frozenset[int]]:
    """Each rank process's descendants (DataLoader workers) as the host sampler last saw them."""
    if host is None:
        return {}
    return {p.pid: frozenset(p.child_pids) for p in host.processes}


def assign_ranks(
    gpus: Sequence[GpuReading],
    ranks: Iterable[RankView],
    child_pids: Mapping[int, Iterable[int]] | None = None,
) -> list[GpuAssignment]:
    """The join itself, on explicit inputs (``join_ranks_to_gpus`` reads them from a snapshot).

    A rank whose UUID matches no GPU here (it runs on another machine, or
    NVML hides that GPU) is on none of them; the PID fallback is used only
    when a rank sent no UUID at all.
    """
    children = {pid: frozenset(kids) for pid, kids in (child_pids or {}).items()}
    rank_list = list(ranks)
    by_uuid: dict[str, int] = {}
    for index, gpu in enumerate(gpus):
        key = normalize_uuid(gpu.uuid)
        if key:
            by_uuid.setdefault(key, index)

    on_gpu: dict[int, list[RankView]] = {index: [] for index in range(len(gpus))}
    observed_pids: set[int] = set()
    for rank in rank_list:
        own = _pids_of(rank, children)
        observed_pids |= own
        key = normalize_uuid(rank.hello.device_uuid)
        position = by_uuid.get(key) if key else _gpu_by_pid(gpus, own)
        if position is not None:
            on_gpu[position].append(rank)
        for other in rank_gpu_uuids(rank)[1:]:  # nn.DataParallel: the rank is on each of its GPUs
            extra = by_uuid.get(other)
            if extra is not None and rank not in on_gpu[extra]:
                on_gpu[extra].append(rank)

    return [
        GpuAssignment(
            gpu=gpu,
            ranks=tuple(on_gpu[position]),
            unobserved=tuple(p for p in gpu.processes if p.pid not in observed_pids),
        )
        for position, gpu in enumerate(gpus)
    ]


def join_ranks_to_gpus(snapshot: Snapshot) -> list[GpuAssignment]:
    """Every GPU in the snapshot's latest GPU sample, with its ranks and its unobserved processes.

    Empty when there is no GPU data (no sample yet, or NVML unavailable).
    Ranks of every status are included; callers that care filter on
    ``RankView.status``.
    """
    if snapshot.gpu is None or not snapshot.gpu.gpus:
        return []
    return assign_ranks(snapshot.gpu.gpus, snapshot.all_ranks(), child_pids_by_rank_pid(snapshot.host))


def _pids_of(rank: RankView, children: Mapping[int, frozenset[int]]) -> set[int]:
    pid = rank.hello.pid
    if not pid:
        return set()
    return {pid, *children.get(pid, ())}


def _gpu_by_pid(gpus: Sequence[GpuReading], pids: set[int]) -> int | None:
    """The GPU where the rank's processes hold the most memory.

    Most memory, not first seen: a rank that also opened a stray context on
    GPU 0 (a classic ``torch.cuda.set_device`` omission) still joins to the
    GPU it trains on.
    """
    best: tuple[int, int] | None = None  # (bytes, position)
    for position, gpu in enumerate(gpus):
        used = [p.used_bytes or 0 for p in gpu.processes if p.pid in pids]
        if used and (best is None or sum(used) > best[0]):
            best = (sum(used), position)
    return None if best is None else best[1]
