"""Host sampling over psutil: CPU, memory, and each rank process with its DataLoader workers.

CPU percentages are deltas between two samples.  The machine-wide figures
come from ``cpu_times`` kept here, not from ``psutil.cpu_percent``, whose
"since the last call" state is global to the process and would be disturbed by
any other caller.  Per process, psutil keeps the previous times inside each
``Process`` object, so those objects live from one sample to the next; a
process seen for the first time has no CPU% yet (None, not 0).

Processes that exit between two samples are dropped without a word: a rank
ending, a worker being replaced, are normal.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import psutil

from gputop.collect.periodic import PeriodicThread
from gputop.collect.store import Store
from gputop.model.samples import BusyProcess, HostSample, ProcessReading
from gputop.processes.procfs import age_s, command_of, cpu_ticks, descendants_of, owner_of, schedstat_s

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess)


def _busy_and_total(times: Any) -> tuple[float, float, float]:
    """(busy, iowait, total) CPU seconds, counted as psutil counts them.

    On Linux guest time is already inside user time, so it is taken out of the
    total; idle and iowait are not busy.
    """
    total = float(sum(times))
    total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    iowait = float(getattr(times, "iowait", 0.0))
    busy = total - float(times.idle) - iowait
    return busy, iowait, total


# The busiest processes kept per sample: enough to name a hog and count the job's
# neighbours, few enough that a sample stays small on a server with thousands.
BUSY_PROCESSES_KEPT = 12
BUSY_MIN_PCT = 5.0  # of one core: below this a process is background noise
# Who else uses the cores is read every 5 s (top's 3-s default, near enough), each
# sample in between repeating it: the read opens every process's stat file, ~25 us
# each (2 ms a second with 73 processes, most of the sampler's cost; a shared node
# runs thousands), and which processes crowd the job changes over minutes, not seconds.
BUSY_EVERY_S = 5.0
# This process's own CPU is read over at least this long (a clock tick is 10 ms).
OWN_MIN_INTERVAL_S = 0.5
# A process started since the last read is rated over its life once it is this old (younger: at the next read).
NEW_PROCESS_MIN_AGE_S = 0.5


def _pct(part: float, whole: float) -> float:
    return max(0.0, min(100.0, 100.0 * part / whole)) if whole > 0 else 0.0


class HostSampler:
    """Reads the host; ``sample()`` is safe to call from any thread (calls are serialised)."""

    def __init__(
        self,
        pids_fn: Callable[[], Iterable[int]] = tuple,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._pids_fn = pids_fn
        self._clock = clock
        self._lock = threading.Lock()
        self._procs: dict[int, psutil.Process] = {}  # ranks and their children, kept for cpu_percent
        # Primed now so the first sample already has a delta to report.
        self._own = psutil.Process()
        self._own_last = (time.monotonic(), self._own_cpu_s())  # when and how much CPU this process had used
        self._last_total = psutil.cpu_times()
        self._last_per_core = psutil.cpu_times(percpu=True)
        self._tick_s = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)
        self._last_ticks = (self._clock(), cpu_ticks())
        self._owners: dict[int, str | None] = {}
        self._busy_now: tuple[BusyProcess, ...] | None = None  # the last read, repeated until the next
        self._last_waits: dict[int, float] = {}  # busy pid -> its threads' run-queue wait (s) at the last read
        self._commands: dict[int, str | None] = {}  # busy pid -> its command line, read once

    def sample(self) -> HostSample:
        with self._lock:
            t = self._clock()
            try:
                pids = [int(p) for p in self._pids_fn()]
            except Exception:  # the caller's snapshot code failing costs the process rows, not the sample
                pids = []
            return HostSample(
                t=t,
                **self._machine(),
                processes=self._processes(pids),
                gputop_pid=self._own.pid,
                busy=self._busy(t),
            )

    def _busy(self, t: float) -> tuple[BusyProcess, ...]:
        """The processes that used the most CPU since the last read (this one left out), from /proc.

        Read on the first sample, then every BUSY_EVERY_S.
        """
        t0, before = self._last_ticks
        if self._busy_now is not None and 0 <= t - t0 < BUSY_EVERY_S:
            return self._busy_now
        now = cpu_ticks()
        self._last_ticks = (t, now)
        span_s = t - t0
        if span_s <= 0:
            return ()
        used = []
        ages: dict[int, float] = {}  # of the processes started since the last read: their stat files read once
        for pid, (ticks, name) in now.items():
            if pid == self._own.pid:
                continue
            if pid in before:
                cpu_pct = 100.0 * (ticks - before[pid][0]) * self._tick_s / span_s
            elif ticks * self._tick_s >= BUSY_MIN_PCT / 100.0 * NEW_PROCESS_MIN_AGE_S:
                # Started since the last read: its CPU over its own life, or a neighbour started
                # after the job would read at the share of the read's span it happened to run.
                age = ages[pid] = age_s(pid) or 0.0
                if age < NEW_PROCESS_MIN_AGE_S:
                    continue  # too young to rate (or gone); the next read will
                cpu_pct = 100.0 * ticks * self._tick_s / min(age, span_s)
            else:
                continue
            if cpu_pct >= BUSY_MIN_PCT:
                used.append((cpu_pct, pid, name))
        used.sort(reverse=True)
        kept = used[:BUSY_PROCESSES_KEPT]
        self._owners = {pid: self._owners[pid] if pid in self._owners else owner_of(pid) for _, pid, _ in kept}
        self._commands = {pid: self._commands[pid] if pid in self._commands else command_of(pid) for _, pid, _ in kept}
        waits = self._waits([pid for _, pid, _ in kept], span_s, ages)
        self._busy_now = tuple(
            BusyProcess(
                pid=pid,
                name=name,
                cpu_pct=round(cpu, 1),
                user=self._owners[pid],
                wait_pct=waits.get(pid),
                command=self._commands[pid],
            )
            for cpu, pid, name in kept
        )
        return self._busy_now

    def _waits(self, pids: list[int], span_s: float, ages: dict[int, float]) -> dict[int, float]:
        """Each busy process's run-queue wait since the last read, 100 = one core (its threads' schedstat).

        A process not kept at the last read counts its wait over its life (``ages``: those already read).
        """
        totals: dict[int, float] = {}
        out: dict[int, float] = {}
        for pid in pids:
            threads = schedstat_s(pid)
            if not threads:
                continue
            total = totals[pid] = sum(wait for _, wait in threads.values())
            if pid in self._last_waits:
                out[pid] = round(100.0 * max(total - self._last_waits[pid], 0.0) / span_s, 1)
            else:
                age = ages[pid] if pid in ages else age_s(pid)
                if age:
                    out[pid] = round(100.0 * total / age, 1)
        self._last_waits = totals
        return out

    def _own_cpu_s(self) -> float:
        times = self._own.cpu_times()
        return float(times.user + times.system)

    def _own_cpu_pct(self) -> float | None:
        """This process's CPU since the last reading, 100 = one core; None over less than OWN_MIN_INTERVAL_S.

        psutil's ``cpu_percent`` divides by however little time passed: the sample taken
        right after the sampler started read 481% (one 10-ms tick over 2 ms), and a
        14-s recording's mean said "this recorder 25% of a core" for a real 0.5%.
        """
        now, cpu = time.monotonic(), self._own_cpu_s()
        since, before = self._own_last
        if now - since < OWN_MIN_INTERVAL_S:
            return None  # too short to tell a tick from a core; the next reading covers it
        self._own_last = (now, cpu)
        return 100.0 * max(cpu - before, 0.0) / (now - since)

    def _machine(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cpu_count": psutil.cpu_count(logical=True)}
        out["gputop_cpu_pct"] = self._own_cpu_pct()  # what watching costs, shown beside the ranks
        total = psutil.cpu_times()
        busy1, iowait1, total1 = _busy_and_total(total)
        busy0, iowait0, total0 = _busy_and_total(self._last_total)
        if total1 > total0:  # two samples within one clock tick have nothing to compare
            out["cpu_pct"] = _pct(busy1 - busy0, total1 - total0)
            if hasattr(total, "iowait"):
                out["iowait_pct"] = _pct(iowait1 - iowait0, total1 - total0)
            self._last_total = total
        per_core = psutil.cpu_times(percpu=True)
        if len(per_core) == len(self._last_per_core):  # a CPU hot-plugged: start over
            deltas = []
            for now, before in zip(per_core, self._last_per_core, strict=True):
                b1, _, t1 = _busy_and_total(now)
                b0, _, t0 = _busy_and_total(before)
                deltas.append(_pct(b1 - b0, t1 - t0))
            out["per_core_pct"] = tuple(deltas)
        self._last_per_core = per_core
        with contextlib.suppress(OSError):  # no load average on this platform: leave it N/A
            out["load_1m"], out["load_5m"], out["load_15m"] = psutil.getloadavg()
        memory = psutil.virtual_memory()
        # total - available, not psutil's "used": page cache that the kernel can drop is not pressure.
        out["mem_used_bytes"] = int(memory.total - memory.available)
        out["mem_total_bytes"] = int(memory.total)
        swap = psutil.swap_memory()
        out["swap_used_bytes"], out["swap_total_bytes"] = int(swap.used), int(swap.total)
        return out

    def _processes(self, pids: list[int]) -> tuple[ProcessReading, ...]:
        if not pids:
            self._procs.clear()
            return ()
        children_of: dict[int, list[int]] | None = None  # psutil's whole-machine map, only where /proc cannot say
        readings: list[ProcessReading] = []
        alive: dict[int, psutil.Process] = {}
        for pid in dict.fromkeys(pids):
            rank = self._cpu_and_rss(pid, alive)
            if rank is None:
                continue  # the rank process is gone
            cpu_pct, rss_bytes = rank
            kids = descendants_of(pid)
            if kids is None:
                children_of = children_of if children_of is not None else _children_map()
                kids = _descendants(pid, children_of)
            kid_cpu: list[float] = []
            live_kids: list[int] = []
            for kid in kids:
                got = self._cpu_and_rss(kid, alive)
                if got is None:
                    continue
                live_kids.append(kid)
                if got[0] is not None:
                    kid_cpu.append(got[0])
            readings.append(
                ProcessReading(
                    pid=pid,
                    cpu_pct=cpu_pct,
                    rss_bytes=rss_bytes,
                    children=len(live_kids),
                    # None when every worker is new: their first CPU% is unknown, not 0.
                    children_cpu_pct=sum(kid_cpu) if kid_cpu else (0.0 if not live_kids else None),
                    child_pids=tuple(live_kids),
                )
            )
        self._procs = alive  # objects of processes not seen this time are released
        return tuple(readings)

    def _cpu_and_rss(self, pid: int, alive: dict[int, psutil.Process]) -> tuple[float | None, int | None] | None:
        """(CPU%, RSS) of one process, None if it is gone; CPU% None on first sight."""
        proc = self._procs.get(pid)
        first = proc is None
        try:
            if proc is None or not proc.is_running():  # is_running also catches a reused pid
                proc, first = psutil.Process(pid), True
            with proc.oneshot():
                cpu = proc.cpu_percent(interval=None)
                rss: int | None = int(proc.memory_info().rss)
        except _GONE:
            return None
        except psutil.AccessDenied:
            # Another user's process (a rank started by someone else): known to exist, unreadable.
            if proc is not None:
                alive[pid] = proc
            return None, None
        alive[pid] = proc
        return (None if first else float(cpu)), rss


def _children_map() -> dict[int, list[int]]:
    """ppid -> pids for every process, read once per sample (``Process.children`` rescans per call)."""
    out: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid", "status"]):
        ppid = proc.info.get("ppid")
        # A zombie is a worker that died and was not reaped yet: no longer the rank's worker.
        if ppid is not None and proc.info.get("status") != psutil.STATUS_ZOMBIE:
            out.setdefault(int(ppid), []).append(proc.pid)
    return out


def _descendants(pid: int, children_of: dict[int, list[int]]) -> list[int]:
    found: list[int] = []
    stack = list(children_of.get(pid, ()))
    while stack:
        child = stack.pop()
        if child in found or child == pid:
            continue
        found.append(child)
        stack.extend(children_of.get(child, ()))
    return sorted(found)


class HostSamplerThread:
    """Samples the host every ``interval_s`` on a daemon thread and adds each sample to the store."""

    def __init__(
        self,
        store: Store,
        pids_fn: Callable[[], Iterable[int]],
        interval_s: float = 1.0,
        *,
        sampler: HostSampler | None = None,
    ) -> None:
        self.sampler = sampler if sampler is not None else HostSampler(pids_fn)
        self._store = store
        self._thread = PeriodicThread("gputop-host-sampler", interval_s, self._tick)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._thread.stop(timeout_s)

    def _tick(self) -> None:
        self._store.add_host(self.sampler.sample())
