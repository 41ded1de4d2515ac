"""Which rank runs on which GPU: the join the TUI, the report and the diagnosis share.

The key is the device UUID each rank reports in its hello (from
``torch.cuda.get_device_properties(i).uuid``) against the UUID NVML gives each
GPU or MIG instance.  A CUDA index is not a key: ``CUDA_VISIBLE_DEVICES`` and
MIG renumber devices per process, so index 0 in a rank is rarely NVML's 0.  A
PID is only the fallback for a rank that sent no UUID, because PIDs differ
between a container and the host NVML sees.

Across hosts: the collector's own NVML readings and each remote host's (from
its node sampler) are joined together.  UUIDs are unique across machines, so a
rank on any host finds its GPU by UUID wherever it is listed; indices and PIDs
are per machine, so the PID fallback and "which processes are no rank's" only
compare a host's GPUs with that host's ranks.  A rank belongs to the readings of
the host its hello names, else (no node sampler there) to the collector's own.

Pure: a snapshot in, assignments out; no NVML, no psutil.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gputop.model.samples import GpuProcess, GpuReading, GpuSample, HostSample
from gputop.model.snapshot import RankSnapshot, Snapshot

_UUID_PREFIXES = ("gpu-", "mig-")


@dataclass(frozen=True)
class GpuAssignment:
    """One GPU (or MIG instance), the ranks that report it as theirs, and who else is on it."""

    gpu: GpuReading
    ranks: tuple[RankSnapshot, ...]  # hello.device_uuid matches gpu.uuid (PID fallback for a rank with no UUID)
    unobserved: tuple[GpuProcess, ...]  # on this GPU, neither a rank's process nor one of its children
    hostname: str = ""  # the host whose node sampler read it; "" for the collector's own machine
    # Processes NVML lists under PIDs from another namespace, taken as these ranks' own (a container)
    from_other_namespace: tuple[GpuProcess, ...] = ()


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


def rank_gpu_uuids(rank: RankSnapshot) -> tuple[str, ...]:
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
    ranks: Iterable[RankSnapshot],
    child_pids: Mapping[int, Iterable[int]] | None = None,
    *,
    hostname: str = "",
    on_host: Callable[[RankSnapshot], bool] | None = None,
) -> list[GpuAssignment]:
    """The join itself, on explicit inputs (``join_ranks_to_gpus`` reads them from a snapshot).

    A rank whose UUID matches no GPU here (it runs on another machine, or
    NVML hides that GPU) is on none of them; the PID fallback is used only
    when a rank sent no UUID at all.  ``on_host`` says which ranks run on the
    machine these GPUs are in (None: all of them): only their PIDs are compared
    with the GPUs' processes, as PIDs of another machine mean nothing here.
    """
    children = {pid: frozenset(kids) for pid, kids in (child_pids or {}).items()}
    rank_list = list(ranks)
    by_uuid: dict[str, int] = {}
    for index, gpu in enumerate(gpus):
        key = normalize_uuid(gpu.uuid)
        if key:
            by_uuid.setdefault(key, index)

    on_gpu: dict[int, list[RankSnapshot]] = {index: [] for index in range(len(gpus))}
    observed_pids: set[int] = set()
    for rank in rank_list:
        local = on_host is None or on_host(rank)
        own = _pids_of(rank, children if local else {})
        key = normalize_uuid(rank.hello.device_uuid)
        position = by_uuid.get(key) if key else (_gpu_by_pid(gpus, own) if local else None)
        if local or position is not None:
            observed_pids |= own  # a rank found here by UUID has its process here, whatever its host says
        if position is not None:
            on_gpu[position].append(rank)
        for other in rank_gpu_uuids(rank)[1:]:  # nn.DataParallel: the rank is on each of its GPUs
            extra = by_uuid.get(other)
            if extra is not None and rank not in on_gpu[extra]:
                on_gpu[extra].append(rank)

    out = []
    for position, gpu in enumerate(gpus):
        others = [p for p in gpu.processes if p.pid not in observed_pids and p.ns_pid not in observed_pids]
        claimed = _claimed_from_other_namespace(gpu, on_gpu[position], others)
        out.append(
            GpuAssignment(
                gpu=gpu,
                ranks=tuple(on_gpu[position]),
                unobserved=tuple(p for p in others if p not in claimed),
                hostname=hostname,
                from_other_namespace=claimed,
            )
        )
    return out


# What a rank's process holds beyond torch's reserved memory: its CUDA context, cuBLAS
# workspaces, NCCL's buffers.  Past this, a hidden process is someone else's.
CONTEXT_SLACK_BYTES = 2 << 30


def _claimed_from_other_namespace(
    gpu: GpuReading, ranks: Sequence[RankSnapshot], others: Sequence[GpuProcess]
) -> tuple[GpuProcess, ...]:
    """The GPU's processes that are its ranks' own, listed under PIDs this machine cannot see.

    NVML reports the host's PIDs; in a container (every Kubernetes pod) the
    rank's own process is listed under a PID that is not in this namespace,
    and would read as a second tenant on every GPU of the job.  A rank joined
    to this GPU by UUID whose own PID is not listed takes one such process,
    the one closest in memory to what the rank holds, unless that process
    holds more than the rank could (torch's reserved memory plus a context).
    What is left is still someone else's.
    """
    listed = {p.pid for p in gpu.processes} | {p.ns_pid for p in gpu.processes if p.ns_pid is not None}
    key = normalize_uuid(gpu.uuid)
    unlisted = [
        r
        for r in ranks
        if normalize_uuid(r.hello.device_uuid) == key
        and (r.hello.device or "").startswith("cuda")  # only a CUDA rank has a process on its GPU
        and r.hello.pid not in listed
    ]
    hidden = [p for p in others if not p.visible]
    claimed: list[GpuProcess] = []
    for rank in unlisted:
        latest = rank.latest
        holds = latest.mem_reserved_bytes if latest is not None else None
        fits = [
            p for p in hidden if p.used_bytes is None or holds is None or p.used_bytes <= holds + CONTEXT_SLACK_BYTES
        ]
        if not fits:
            continue
        best = min(fits, key=lambda p: abs((p.used_bytes or 0) - (holds or 0)))
        claimed.append(best)
        hidden.remove(best)
    return tuple(claimed)


def gpu_groups(snapshot: Snapshot) -> list[GpuSample]:
    """The latest GPU sample of each machine: the collector's own first, then each host's by name.

    A GPU already listed by an earlier sample is left out of a later one (a node
    sampler on the collector's own machine, under a container's host name), so
    no GPU and no rank is counted twice.
    """
    groups = [snapshot.gpu] if snapshot.gpu is not None and snapshot.gpu.gpus else []
    seen = {normalize_uuid(g.uuid) for sample in groups for g in sample.gpus}
    for sample in snapshot.node_gpus:
        fresh = tuple(g for g in sample.gpus if normalize_uuid(g.uuid) not in seen or not g.uuid)
        seen |= {normalize_uuid(g.uuid) for g in fresh}
        if fresh:
            groups.append(GpuSample(t=sample.t, gpus=fresh, driver_version=sample.driver_version,
                                    hostname=sample.hostname))  # fmt: skip
    return groups


def on_host_of(hostname: str, remote_hosts: Iterable[str]) -> Callable[[RankSnapshot], bool]:
    """Which ranks run where a sample of ``hostname`` was read ("" the collector's machine: every rank
    whose host sends no readings of its own)."""
    if hostname:
        return lambda rank: rank.hello.hostname == hostname
    elsewhere = frozenset(remote_hosts)
    return lambda rank: rank.hello.hostname not in elsewhere


def join_ranks_to_gpus(snapshot: Snapshot) -> list[GpuAssignment]:
    """Every GPU in the snapshot's latest GPU samples (every host's), with its ranks and unobserved processes.

    Empty when there is no GPU data (no sample yet, or NVML unavailable
    everywhere).  Ranks of every status are included; callers that care
    filter on ``RankSnapshot.status``.  The collector's own GPUs come first, then
    each host's in host-name order.
    """
    groups = gpu_groups(snapshot)
    if not groups:
        return []
    ranks = snapshot.all_ranks()
    remote = [sample.hostname for sample in snapshot.node_gpus]
    children = child_pids_by_rank_pid(snapshot.host)
    out: list[GpuAssignment] = []
    for sample in groups:
        out += assign_ranks(
            sample.gpus,
            ranks,
            children if not sample.hostname else None,  # the host sampler watches this machine only
            hostname=sample.hostname,
            on_host=on_host_of(sample.hostname, remote),
        )
    return out


def _pids_of(rank: RankSnapshot, children: Mapping[int, frozenset[int]]) -> set[int]:
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
