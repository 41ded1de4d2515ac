"""What the dashboard-side samplers produce: immutable readings of GPUs and the host.

The samplers (``gpu.py`` over NVML, ``host.py`` over psutil) fill these; the
store keeps the latest and a short history; the recorder writes them as JSON
lines and ``report``/``replay`` read them back.  A value that could not be read
is None, and where the reason is known it is in ``na`` (field name -> reason),
so the UI can show N/A with the reason one keypress away.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import msgspec


@dataclass(frozen=True)
class GpuProcess:
    """A process with a context on a GPU."""

    pid: int
    used_bytes: int | None = None
    sm_util_pct: float | None = None  # since the previous sample
    mem_util_pct: float | None = None
    name: str | None = None
    # False when NVML lists a PID this machine's /proc does not have: the host's PID of a process in a
    # container (NVML reports host PIDs), or one that exited since.
    visible: bool = True
    # Its PID in the innermost PID namespace (/proc/PID/status NSpid), where that differs: the PID a
    # rank in a container reports for itself while NVML and this host list it under the host's.
    ns_pid: int | None = None


@dataclass(frozen=True)
class GpuReading:
    """One GPU (or one MIG instance) at one moment."""

    index: int
    uuid: str
    name: str = ""
    util_pct: float | None = None
    mem_util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    mem_reserved_bytes: int | None = None  # held by the driver (nvmlMemory_v2_t), not in mem_used_bytes
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    pcie_rx_bytes_s: float | None = None
    pcie_tx_bytes_s: float | None = None
    nvlink_rx_bytes_s: float | None = None  # all links together
    nvlink_tx_bytes_s: float | None = None
    throttle_reasons: tuple[str, ...] = ()
    ecc_errors: int | None = None
    sm_active_pct: float | None = None  # GPM, Hopper and newer
    tensor_active_pct: float | None = None  # GPM, Hopper and newer
    mig_parent_uuid: str | None = None  # set on a MIG instance's row
    processes: tuple[GpuProcess, ...] = ()
    na: dict[str, str] = field(default_factory=dict)  # field -> why it is N/A


@dataclass(frozen=True)
class GpuSample:
    """Every GPU on one machine at one moment, or why there is no GPU data."""

    t: float
    gpus: tuple[GpuReading, ...] = ()
    unavailable: str | None = None  # one line: why there is no GPU data at all
    driver_version: str | None = None
    # "" for the collector's own machine (and every recording made before node samplers);
    # else the host whose node sampler sent it (``gputop.node``), as its ranks' hellos name it.
    hostname: str = ""


@dataclass(frozen=True)
class ProcessReading:
    """CPU and memory of one training process and its DataLoader workers."""

    pid: int
    cpu_pct: float | None = None  # 100 = one core
    rss_bytes: int | None = None
    children: int = 0
    children_cpu_pct: float | None = None
    child_pids: tuple[int, ...] = ()  # so the rank-GPU join counts workers' GPU contexts as the rank's


@dataclass(frozen=True)
class BusyProcess:
    """A process on the host using CPU, whoever it belongs to: the job's, another user's, a stray one."""

    pid: int
    name: str
    cpu_pct: float  # since the previous sample, 100 = one core
    user: str | None = None
    # Runnable but waiting for a CPU over the same time, 100 = one core's worth (None: not read): what it
    # wanted beyond what it got, so a busy loop squeezed to 60% of a core still counts as wanting a whole one.
    wait_pct: float | None = None
    command: str | None = None  # its command line, cut short (None: not read, or a kernel thread)

    @property
    def demand_pct(self) -> float:
        """The CPU it wanted, 100 = one core: what it used and what it waited for."""
        return self.cpu_pct + (self.wait_pct or 0.0)


@dataclass(frozen=True)
class HostSample:
    """The machine's CPU, memory and the rank processes at one moment."""

    t: float
    cpu_pct: float | None = None
    per_core_pct: tuple[float, ...] = ()
    iowait_pct: float | None = None
    load_1m: float | None = None
    load_5m: float | None = None
    load_15m: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    swap_used_bytes: int | None = None
    swap_total_bytes: int | None = None
    cpu_count: int | None = None
    processes: tuple[ProcessReading, ...] = ()
    gputop_cpu_pct: float | None = None  # this dashboard or recorder process itself, 100 = one core
    gputop_pid: int | None = None  # that process, so it is never counted as someone else's load
    busy: tuple[BusyProcess, ...] = ()  # the busiest processes on the host (any owner), busiest first


def sample_to_dict(sample: GpuSample | HostSample) -> dict[str, Any]:
    """The JSON object a recording stores for a sample (``type`` is gpu, node_gpu or host).

    Another host's GPUs are ``node_gpu`` lines, not ``gpu`` lines with a host
    name: a gputop from before node samplers skips a line type it does not
    know, where it would have taken another host's GPUs for its own.
    """
    if isinstance(sample, GpuSample):
        kind = "node_gpu" if sample.hostname else "gpu"
        obj = asdict(sample)
        if not sample.hostname:
            del obj["hostname"]
        return {"type": kind, **obj}
    return {"type": "host", **asdict(sample)}


def gpu_sample_to_wire(sample: GpuSample) -> dict[str, Any]:
    """A sample as a node sends it: None fields, empty tuples and empty dicts left out (they are the defaults)."""

    def compact(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: compact(v) for k, v in value.items() if v is not None and v != () and v != {} and v != []}
        if isinstance(value, (list, tuple)):
            return [compact(v) for v in value]
        return value

    obj = compact(asdict(sample))
    obj.pop("hostname", None)  # the message says whose it is
    return obj  # type: ignore[no-any-return]


def gpu_sample_from_wire(obj: dict[str, Any], *, hostname: str, t: float) -> GpuSample:
    """A node's sample, every field checked against its type; ``ValueError`` says what is wrong.

    ``t`` replaces the node's own time: the collector's receive time keeps every
    host's samples on one clock (nodes' clocks drift), as windows' ``recv_t`` do.
    """
    try:
        sample = msgspec.convert(obj, GpuSample)
    except msgspec.ValidationError as exc:
        raise ValueError(f"gpus sample: {exc}") from None
    return replace(sample, t=t, hostname=hostname)


def gpu_sample_from_dict(obj: dict[str, Any]) -> GpuSample:
    gpus = []
    for g in obj.get("gpus", ()):
        g = dict(g)
        g["processes"] = tuple(GpuProcess(**p) for p in g.get("processes", ()))
        g["throttle_reasons"] = tuple(g.get("throttle_reasons", ()))
        gpus.append(GpuReading(**g))
    return GpuSample(
        t=obj["t"],
        gpus=tuple(gpus),
        unavailable=obj.get("unavailable"),
        driver_version=obj.get("driver_version"),
        hostname=str(obj.get("hostname") or ""),
    )


def host_sample_from_dict(obj: dict[str, Any]) -> HostSample:
    fields_ = {k: v for k, v in obj.items() if k != "type"}
    fields_["per_core_pct"] = tuple(fields_.get("per_core_pct", ()))
    fields_["processes"] = tuple(
        ProcessReading(**{**p, "child_pids": tuple(p.get("child_pids", ()))}) for p in fields_.get("processes", ())
    )
    fields_["busy"] = tuple(BusyProcess(**p) for p in fields_.get("busy", ()))
    return HostSample(**fields_)
