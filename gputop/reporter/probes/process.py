"""CPU, RSS and threads of the rank process, the CPU of its children (DataLoader workers), and their run-queue wait.

The run-queue wait (``/proc/<pid>/task/<tid>/schedstat``) is how long the
threads were ready to run while no CPU was free: CPU contention measured
where it happens, for the training thread, all the rank's threads (gloo's
all-reduce runs in its own) and the workers.
"""

from __future__ import annotations

from typing import Any

from gputop.procfs import RunQueueWait, children_of, is_comm_thread, schedstat_s, thread_name
from gputop.reporter.clock import StepMark


class ProcessProbe:
    """psutil on this process; CPU% is the delta since the previous window (None on the first)."""

    name = "cpu"
    not_measured: str | None = None

    def __init__(self, train_tid: int | None = None) -> None:
        import psutil  # imported on the reporter thread's first window, not at `import gputop`

        self._psutil = psutil
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call only sets the baseline
        self._children: dict[int, Any] = {}  # pid -> Process, kept for their cpu_percent baselines
        self._primed = False
        self._train_tid = train_tid
        self._main_wait, self._rank_wait, self._workers_wait = RunQueueWait(), RunQueueWait(), RunQueueWait()
        self._rank_run = RunQueueWait()  # CPU time of the same threads as _rank_wait
        self._comm_threads: dict[int, bool] = {}  # tid -> a gloo/NCCL thread (names read once per thread)

    def _child_pids(self) -> list[int]:
        """Direct children from /proc (a few reads); psutil's whole-machine scan only where /proc cannot say."""
        pids = children_of(self._process.pid)
        if pids is None:
            pids = [c.pid for c in self._process.children(recursive=False)]
        return pids

    def read(self, marks: list[StepMark]) -> dict[str, Any]:
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

    def _run_queue_wait(self, pid: int, children: list[int]) -> dict[str, float]:
        """Seconds the training thread, the rank's compute threads and the workers waited for a CPU.

        The rank's gloo/NCCL threads are left out: their CPU is the gradient
        exchange itself, which the communication figures already account for.
        """
        own = schedstat_s(pid)
        if own is None:
            return {}  # no schedstat on this kernel: the fields stay N/A
        out: dict[str, float] = {}
        for tid in own.keys() - self._comm_threads.keys():
            self._comm_threads[tid] = is_comm_thread(thread_name(pid, tid))
        for tid in self._comm_threads.keys() - own.keys():
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
