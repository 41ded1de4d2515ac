"""CPU, RSS and threads of the rank process, the CPU of its children (DataLoader workers), and their run-queue wait.

The run-queue wait (``/proc/<pid>/task/<tid>/schedstat``) is how long the
threads were ready to run while no CPU was free: CPU contention measured
where it happens, for the training thread, all the rank's threads (gloo's
all-reduce runs in its own) and the workers.

On Linux everything comes from /proc through bare file descriptors, in one pass
over the rank's threads (their schedstat and their children), plus
``time.process_time()`` for the CPU and ``statm`` for the RSS: ~100 µs a window
on a 2-vCPU VM where psutil's ``oneshot()`` (CPU, RSS, threads) and the Python
file objects cost ~380 µs (docs/performance.md, "The reporter's cost (issue #35)").
psutil stays the fallback where /proc cannot say, imported only then.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from gputop.processes.procfs import RunQueueWait, children_of, is_comm_thread, schedstat_s, thread_name
from gputop.reporter.clock import StepMark

_PROC = "/proc"
_READ_MAX_BYTES = 4096  # a stat line is under 1.3 KiB; a thread's children list a few pids
# Every thread's children list is read every this many windows (5 s); in between, those of the threads that had
# children then, and the training thread's: ~3 system calls saved per thread per window.
FULL_SCAN_EVERY = 10


def _read(path: str) -> bytes | None:
    """A small /proc file's bytes through a bare descriptor (a file object costs as much as the read); None if gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, _READ_MAX_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)


def _stat_ticks(pid: int) -> int | None:
    """A live process's CPU so far (utime + stime, clock ticks) from its stat file; None if gone or a zombie."""
    data = _read(f"{_PROC}/{pid}/stat")
    if not data:
        return None
    fields = data.rpartition(b")")[2].split(None, 13)
    try:
        # After "(comm)": the state first, utime the 12th field, stime the 13th (proc(5) fields 3, 14 and 15).
        return None if fields[0] == b"Z" else int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


def _linux_fast_path(pid: int) -> bool:
    """Whether /proc has what the fast path reads: per-thread schedstat and children, and statm."""
    task = f"{_PROC}/{pid}/task/{pid}"
    return all(os.path.exists(path) for path in (f"{task}/schedstat", f"{task}/children", f"{_PROC}/{pid}/statm"))


class ProcessProbe:
    """This process from /proc (else psutil); CPU% is the delta since the previous window (None on the first)."""

    name = "cpu"
    not_measured: str | None = None

    def __init__(self, train_tid: int | None = None, *, fast: bool | None = None) -> None:
        """``fast``: read /proc directly (None: where it has what is read); False: psutil, as on other systems."""
        self._pid = os.getpid()
        self._fast = _linux_fast_path(self._pid) if fast is None else fast
        self._psutil: Any = None
        self._process: Any = None
        if not self._fast:
            import psutil  # imported on the reporter thread's first window, not at `import gputop`; /proc needs none

            self._psutil = psutil
            self._process = psutil.Process()
            self._process.cpu_percent(None)  # the first call only sets the baseline
        self._children: dict[int, Any] = {}  # pid -> Process (psutil) or CPU ticks at the last read (/proc)
        self._primed = False
        self._train_tid = train_tid
        self._main_wait, self._rank_wait, self._workers_wait = RunQueueWait(), RunQueueWait(), RunQueueWait()
        self._rank_run = RunQueueWait()  # CPU time of the same threads as _rank_wait
        self._comm_threads: dict[int, bool] = {}  # tid -> a gloo/NCCL thread (names read once per thread)
        self._page_bytes = os.sysconf("SC_PAGE_SIZE") if self._fast else 0
        self._tick_s = 1.0 / os.sysconf("SC_CLK_TCK") if self._fast else 0.0
        self._cpu_mark = (time.monotonic(), time.process_time())  # the baseline of the first CPU%
        # Whose children to read each window: the training thread's (it forks the DataLoader workers) and those a
        # full look over every thread found with children; every thread's every FULL_SCAN_EVERY reads.
        self._parents: set[int] = set() if train_tid is None else {train_tid}
        self._reads = 0

    def _child_pids(self) -> list[int]:
        """Direct children from /proc (a few reads); psutil's whole-machine scan only where /proc cannot say."""
        pids = children_of(self._process.pid)
        if pids is None:
            pids = [c.pid for c in self._process.children(recursive=False)]
        return pids

    def read(self, marks: list[StepMark]) -> dict[str, Any]:
        return self._read_proc() if self._fast else self._read_psutil()

    def _read_proc(self) -> dict[str, Any]:
        """One pass over /proc/<pid>/task: each thread's schedstat and children; the CPU and RSS besides."""
        pid = self._pid
        now, cpu_s = time.monotonic(), time.process_time()
        (then, cpu_then), self._cpu_mark = self._cpu_mark, (now, cpu_s)
        task_dir = f"{_PROC}/{pid}/task"
        tasks = os.listdir(task_dir)
        own: dict[int, tuple[float, float]] | None = {}
        found: set[int] = set()
        full_scan = self._reads % FULL_SCAN_EVERY == 0
        self._reads += 1
        parents = self._parents
        comm = self._comm_threads
        for name in tasks:
            tid = int(name)
            # A gloo/NCCL thread's wait is left out of every figure: its schedstat is not read (once its name is).
            if own is not None and not comm.get(tid):
                stat = _read(f"{task_dir}/{name}/schedstat")
                if stat is not None:
                    try:
                        run_ns, wait_ns = stat.split()[:2]
                        own[tid] = (int(run_ns) / 1e9, int(wait_ns) / 1e9)
                    except ValueError:
                        pass
                elif os.path.exists(f"{task_dir}/{name}"):
                    own = None  # the thread exists but the kernel keeps no schedstat: the waits stay N/A
            if not full_scan and tid not in parents:
                continue
            kids = _read(f"{task_dir}/{name}/children")
            if kids:
                found.update(int(child) for child in kids.split())
                if full_scan:
                    parents.add(tid)
        statm = _read(f"{_PROC}/{pid}/statm") or b""
        out: dict[str, Any] = {"threads": len(tasks)}
        with contextlib.suppress(IndexError, ValueError):
            out["rss_bytes"] = int(statm.split()[1]) * self._page_bytes
        wall_s = now - then
        if self._primed and wall_s > 0:
            out["cpu_pct"] = 100.0 * (cpu_s - cpu_then) / wall_s
        self._primed = True
        children: list[int] = []
        worker_ticks = 0
        ticks_now: dict[int, Any] = {}
        for child in sorted(found):
            ticks = _stat_ticks(child)
            if ticks is None:
                continue  # gone, or exited and not reaped yet: no longer anyone's worker
            children.append(child)
            known = self._children.get(child)
            if known is not None:
                worker_ticks += max(ticks - known, 0)
            ticks_now[child] = ticks  # a child first seen sets its baseline; its first figure comes next window
        self._children = ticks_now
        out["workers"] = len(children)
        if children and wall_s > 0:
            out["workers_cpu_pct"] = 100.0 * worker_ticks * self._tick_s / wall_s
        out.update(self._run_queue_wait(pid, children, own, set(map(int, tasks))))
        return out

    def _read_psutil(self) -> dict[str, Any]:
        psutil, proc = self._psutil, self._process
        with proc.oneshot():
            cpu_pct = proc.cpu_percent(None)
            out: dict[str, Any] = {"rss_bytes": proc.memory_info().rss, "threads": proc.num_threads()}
        if self._primed:
            out["cpu_pct"] = cpu_pct
        self._primed = True
        children = self._child_pids()
        worker_cpu = 0.0
        for pid in children:
            known = self._children.get(pid)
            try:
                if known is None:
                    child = psutil.Process(pid)
                    child.cpu_percent(None)  # the baseline; its first figure comes next window
                    self._children[pid] = child
                else:
                    worker_cpu += known.cpu_percent(None)
            except psutil.Error:
                pass
        for pid in set(self._children) - set(children):
            del self._children[pid]
        out["workers"] = len(children)
        if children:
            out["workers_cpu_pct"] = worker_cpu
        out.update(self._run_queue_wait(proc.pid, children))
        return out

    def _run_queue_wait(
        self,
        pid: int,
        children: list[int],
        own: dict[int, tuple[float, float]] | None = None,
        tids: set[int] | None = None,
    ) -> dict[str, float]:
        """Seconds the training thread, the rank's compute threads and the workers waited for a CPU.

        The rank's gloo/NCCL threads are left out: their CPU is the gradient
        exchange itself, which the communication figures already account for.
        """
        if own is None:
            own = schedstat_s(pid)
        if own is None:
            return {}  # no schedstat on this kernel: the fields stay N/A
        out: dict[str, float] = {}
        threads_now = set(own) if tids is None else tids  # every thread (the comm threads' schedstat may be unread)
        for tid in threads_now - self._comm_threads.keys():
            self._comm_threads[tid] = is_comm_thread(thread_name(pid, tid))
        for tid in self._comm_threads.keys() - threads_now:
            del self._comm_threads[tid]
        compute = {tid: times for tid, times in own.items() if not self._comm_threads.get(tid)}
        main = {(pid, tid): wait for tid, (_, wait) in own.items() if tid == self._train_tid}
        for name, tracker, threads in (
            ("main_cpu_wait_s", self._main_wait, main),
            ("cpu_wait_s", self._rank_wait, {(pid, tid): wait for tid, (_, wait) in compute.items()}),
            ("cpu_run_s", self._rank_run, {(pid, tid): run for tid, (run, _) in compute.items()}),
        ):
            waited = tracker.delta_s(threads) if threads else None
            if waited is not None:
                out[name] = waited
        workers: dict[tuple[int, int], float] = {}
        for child in children:
            for tid, (_, wait) in (schedstat_s(child) or {}).items():
                workers[(child, tid)] = wait
        waited = self._workers_wait.delta_s(workers)
        if waited is not None and children:
            out["workers_cpu_wait_s"] = waited
        return out
