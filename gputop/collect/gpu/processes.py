"""Which processes use a GPU, and how much of it each: the per-process half of a GPU sample.

NVML lists each GPU's compute and graphics processes with their memory, and
keeps a short buffer of per-process SM and memory utilization samples.  This
joins the two, and says of each PID whether it is in this PID namespace (NVML
names the host's PIDs; inside a container they are not in /proc), its PID
inside its own namespace when that differs, and its name for the UI.  The
listing's versioned C call is ``nvml_processes``; the rank-to-GPU join that
reads these is ``gputop.model.join``.
"""

from __future__ import annotations

from collections.abc import Callable

from gputop.collect.gpu.nvml import GPU_LOST, NOT_FOUND, DeviceReads, Nvml
from gputop.collect.gpu.nvml_processes import VERSIONS, ProcessEntry, list_processes
from gputop.model.samples import GpuProcess

UTIL_PIDS_ELSEWHERE = "NVML's utilization samples name PIDs from another namespace"


def pid_here(pid: int) -> tuple[bool, int | None]:
    """Whether ``pid`` is in this PID namespace, and its PID in its own innermost namespace if other.

    NVML reports the host's PIDs.  Inside a container they are not in /proc
    (False); on the host, a containerised rank is, and its status's ``NSpid``
    line ends with the PID the rank knows itself by.
    """
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    pids = line.split()[1:]
                    return True, int(pids[-1]) if len(pids) > 1 else None
    except (OSError, ValueError):
        return False, None
    return True, None


def process_name(pid: int) -> str | None:
    """A process's name for the UI, or None when it is gone or hidden from us."""
    try:
        import psutil

        return str(psutil.Process(pid).name())
    except Exception:  # vanished between NVML listing it and now, or another PID namespace
        return None


class ProcessReader:
    """Reads the processes on one device per call; remembers, per device, the newest utilization sample read."""

    def __init__(
        self,
        nvml: Nvml,
        *,
        name_of_pid: Callable[[int], str | None] = process_name,
        pid_here: Callable[[int], tuple[bool, int | None]] = pid_here,
    ) -> None:
        self.nvml = nvml
        self._name_of_pid = name_of_pid
        self._pid_here = pid_here
        self._util_seen_us: dict[str, int] = {}  # device -> newest process-utilization timestamp read

    def read(self, reads: DeviceReads) -> tuple[GpuProcess, ...]:
        """The device's processes by PID, each with its memory, utilization, namespace and name."""
        used: dict[int, int | None] = {}
        for kind, field in (("Compute", "processes"), ("Graphics", "graphics_processes")):
            for entry in self._list_processes(reads, kind, field) or ():
                used.setdefault(entry.pid, entry.used_bytes)
        if not used:
            return ()
        sm_util, mem_util = self._read_process_utilization(reads, set(used))
        processes = []
        for pid, used_bytes in sorted(used.items()):
            visible, ns_pid = self._pid_here(pid)
            processes.append(
                GpuProcess(
                    pid=pid,
                    used_bytes=used_bytes,
                    sm_util_pct=sm_util.get(pid),
                    mem_util_pct=mem_util.get(pid),
                    name=self._name_of_pid(pid) if visible else None,
                    visible=visible,
                    ns_pid=ns_pid,
                )
            )
        return tuple(processes)

    def _list_processes(self, reads: DeviceReads, kind: str, field: str) -> list[ProcessEntry] | None:
        """``nvmlDevice...RunningProcesses`` through the newest version this driver has (v3, v2, v1)."""
        lib = self.nvml.lib
        for suffix, sizes in VERSIONS:
            c_name = f"nvmlDeviceGet{kind}RunningProcesses{suffix}"
            if self.nvml.is_missing(c_name):
                continue
            listed: list[ProcessEntry] | None = reads.get_with(
                field, c_name, lambda h, c_name=c_name, sizes=sizes: list_processes(lib, h, c_name, sizes),
                record=field == "processes",
            )  # fmt: skip
            if listed is not None or not self.nvml.is_missing(c_name) or reads.lost:
                return listed
            reads.na.pop(field, None)
        if field == "processes":
            reads.na[field] = "no process-listing call in this driver"
        return None

    def _read_process_utilization(
        self, reads: DeviceReads, pids: set[int]
    ) -> tuple[dict[int, float], dict[int, float]]:
        """Mean SM and memory utilization per process since the previous sample.

        NVML keeps a short buffer of per-process samples; passing the newest
        timestamp already read returns exactly the ones not seen yet, where a
        fixed "now - 1 s" would drop or double-count samples whenever this
        thread runs late.
        """
        since_us = self._util_seen_us.get(reads.device, 0)
        value, why = self.nvml.call(
            "nvmlDeviceGetProcessUtilization",
            reads.handle,
            since_us,
            device=reads.device,
            field="process_sm_util_pct",
        )
        if value is None:
            if why == GPU_LOST:
                reads.lost = True
            # NOT_FOUND: no new samples since last time, which is news, not a failure.
            if why not in (None, NOT_FOUND):
                reads.na["process_sm_util_pct"] = why
            return {}, {}
        sums: dict[int, list[float]] = {}
        newest = since_us
        for s in value:
            newest = max(newest, int(s.timeStamp))
            pid = int(s.pid)
            if pid in pids:  # samples of processes that exited since are dropped
                acc = sums.setdefault(pid, [0.0, 0.0, 0.0])
                acc[0] += float(s.smUtil)
                acc[1] += float(s.memUtil)
                acc[2] += 1
        self._util_seen_us[reads.device] = newest
        if not sums and value and len(pids) == 1:
            # Drivers from 560.35 translate the listed PIDs into this container's namespace but not
            # the utilization samples' (HAMi-core #112): with one process on the GPU, the samples are its.
            only = next(iter(pids))
            samples = list(value)
            sums[only] = [
                sum(float(s.smUtil) for s in samples),
                sum(float(s.memUtil) for s in samples),
                float(len(samples)),
            ]
        elif not sums and value:
            reads.na["process_sm_util_pct"] = UTIL_PIDS_ELSEWHERE
        return (
            {pid: acc[0] / acc[2] for pid, acc in sums.items()},
            {pid: acc[1] / acc[2] for pid, acc in sums.items()},
        )
