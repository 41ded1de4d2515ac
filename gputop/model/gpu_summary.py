"""GPU summary over a run's samples, for ``gputop report``: per GPU, how busy, how full, how hot, whose.

``summarize_gpus`` returns plain JSON-ready data; ``gputop.report`` prints it
as text, markdown or JSON.
Means and maxima are over the samples where the value was read: a field
never read is left out of the numbers and its reason is in ``na``.  Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from gputop.model.join import assign_ranks, child_pids_by_rank_pid, on_host_of
from gputop.model.samples import GpuReading, GpuSample
from gputop.model.snapshot import Snapshot


class Unobserved(TypedDict):
    """A process on a GPU that no rank reports, as the summary lists it."""

    pid: int
    name: str | None
    max_used_bytes: int | None  # the most it held in any sample; None: never read


@dataclass
class _Acc:
    """Everything seen of one GPU across samples."""

    first: GpuReading
    last: GpuReading
    hostname: str = ""  # "" the collector's own machine
    samples: int = 0
    util: list[float] = field(default_factory=list)
    mem_used: list[int] = field(default_factory=list)
    power: list[float] = field(default_factory=list)
    temp: list[float] = field(default_factory=list)
    sm_active: list[float] = field(default_factory=list)
    tensor_active: list[float] = field(default_factory=list)
    throttled: dict[str, int] = field(default_factory=dict)
    # bytes/s each way, by link: "pcie_rx", "pcie_tx", "nvlink_rx", "nvlink_tx"
    links: dict[str, list[float]] = field(default_factory=dict)
    other_namespace: set[int] = field(default_factory=set)  # PIDs NVML gave for its ranks' own processes
    na: dict[str, str] = field(default_factory=dict)
    ranks: set[tuple[str, int, str]] = field(default_factory=set)
    unobserved: dict[int, Unobserved] = field(default_factory=dict)


LINKS = ("pcie_rx", "pcie_tx", "nvlink_rx", "nvlink_tx")


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize_gpus(samples: Sequence[GpuSample], snapshot: Snapshot | None = None) -> dict[str, Any]:
    """Per GPU over ``samples``: utilization, memory peak, power, the ranks on it (via the join).

    ``samples`` may mix hosts (``Snapshot.gpu_samples()``): each GPU is listed
    under the host that read it, joined as the live view joins (UUIDs across
    hosts, PIDs within one).  ``snapshot`` supplies the ranks (their hellos);
    without it ``ranks`` is empty.  With no GPU data at all, ``unavailable``
    says why.
    """
    with_data = [s for s in samples if s.gpus]
    driver = next((s.driver_version for s in reversed(samples) if s.driver_version), None)
    out: dict[str, Any] = {"samples": len(samples), "driver_version": driver, "unavailable": None, "gpus": []}
    if not with_data:
        reasons = [s.unavailable for s in samples if s.unavailable]
        out["unavailable"] = reasons[-1] if reasons else "no GPU samples were recorded"
        return out

    ranks = snapshot.all_ranks() if snapshot is not None else []
    children = child_pids_by_rank_pid(snapshot.host) if snapshot is not None else {}
    remote = {s.hostname for s in samples if s.hostname}
    accs: dict[tuple[str, str], _Acc] = {}
    for sample in with_data:
        host = sample.hostname
        # Joined with no rank too: every process on a GPU is then one nobody reports, and the GPU lists it.
        assignments = assign_ranks(
            sample.gpus, ranks, None if host else children, hostname=host, on_host=on_host_of(host, remote)
        )
        for position, reading in enumerate(sample.gpus):
            key = (host, reading.uuid or f"#{reading.index}")
            acc = accs.get(key)
            if acc is None:
                acc = accs[key] = _Acc(first=reading, last=reading, hostname=host)
            _add(acc, reading)
            if assignments:
                assignment = assignments[position]
                acc.ranks.update((rv.run_id, rv.rank, rv.hello.hostname) for rv in assignment.ranks)
                acc.other_namespace.update(p.pid for p in assignment.from_other_namespace)
                for proc in assignment.unobserved:
                    blank: Unobserved = {"pid": proc.pid, "name": proc.name, "max_used_bytes": None}
                    seen = acc.unobserved.setdefault(proc.pid, blank)
                    if proc.used_bytes is not None:
                        seen["max_used_bytes"] = max(seen["max_used_bytes"] or 0, proc.used_bytes)
                    seen["name"] = seen["name"] or proc.name

    order = {
        key: (acc.hostname, acc.first.index, acc.first.mig_parent_uuid is not None, key) for key, acc in accs.items()
    }
    out["gpus"] = [_gpu_summary(accs[key]) for key in sorted(accs, key=order.__getitem__)]
    return out


def _add(acc: _Acc, reading: GpuReading) -> None:
    acc.last = reading
    acc.samples += 1
    if reading.util_pct is not None:
        acc.util.append(reading.util_pct)
    if reading.mem_used_bytes is not None:
        acc.mem_used.append(reading.mem_used_bytes)
    if reading.power_w is not None:
        acc.power.append(reading.power_w)
    if reading.temp_c is not None:
        acc.temp.append(reading.temp_c)
    if reading.sm_active_pct is not None:
        acc.sm_active.append(reading.sm_active_pct)
    if reading.tensor_active_pct is not None:
        acc.tensor_active.append(reading.tensor_active_pct)
    for link in LINKS:
        rate = getattr(reading, f"{link}_bytes_s")
        if rate is not None:
            acc.links.setdefault(link, []).append(rate)
    for reason in reading.throttle_reasons:
        acc.throttled[reason] = acc.throttled.get(reason, 0) + 1
    acc.na.update(reading.na)


def _gpu_summary(acc: _Acc) -> dict[str, Any]:
    last = acc.last
    total = next((r.mem_total_bytes for r in (last, acc.first) if r.mem_total_bytes), None)
    read = {
        "util_pct": acc.util,
        "mem_used_bytes": acc.mem_used,
        "power_w": acc.power,
        "temp_c": acc.temp,
        "sm_active_pct": acc.sm_active,
        "tensor_active_pct": acc.tensor_active,
    }
    # Only reasons for fields never read: a GPU lost for one sample still had readings.
    never = {name: acc.na[name] for name, values in read.items() if not values and name in acc.na}
    if "gpu" in last.na:
        never["gpu"] = last.na["gpu"]
    return {
        "hostname": acc.hostname,  # "" the recorder's own machine
        "index": acc.first.index,
        "uuid": acc.first.uuid,
        "name": acc.first.name or last.name,
        "mig_parent_uuid": acc.first.mig_parent_uuid,
        "samples": acc.samples,
        "util_mean_pct": _mean(acc.util),
        "util_max_pct": max(acc.util, default=None),
        "mem_peak_bytes": max(acc.mem_used, default=None),
        "mem_total_bytes": total,
        "mem_reserved_bytes": last.mem_reserved_bytes,  # the driver's own, not in mem_peak_bytes
        "link_mean_bytes_s": {link: _mean(acc.links[link]) for link in LINKS if link in acc.links},
        "link_max_bytes_s": {link: max(acc.links[link]) for link in LINKS if link in acc.links},
        "pids_from_other_namespace": sorted(acc.other_namespace),
        "power_mean_w": _mean(acc.power),
        "power_max_w": max(acc.power, default=None),
        "power_limit_w": last.power_limit_w if last.power_limit_w is not None else acc.first.power_limit_w,
        "temp_max_c": max(acc.temp, default=None),
        "sm_active_mean_pct": _mean(acc.sm_active),  # GPM
        "tensor_active_mean_pct": _mean(acc.tensor_active),  # GPM
        "throttle_share_pct": {r: 100.0 * n / acc.samples for r, n in sorted(acc.throttled.items())},
        "ecc_errors": last.ecc_errors,
        "ranks": [{"run_id": run, "rank": rank, "hostname": host} for run, rank, host in sorted(acc.ranks)],
        "unobserved": [acc.unobserved[pid] for pid in sorted(acc.unobserved)],
        "na": never,
    }
