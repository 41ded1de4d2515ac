"""CPU, RSS and threads of the rank process, and the CPU of its children (DataLoader workers)."""

from __future__ import annotations

from typing import Any

from gputop.procfs import children_of
from gputop.reporter.clock import StepMark


class ProcessProbe:
    """psutil on this process; CPU% is the delta since the previous window (None on the first)."""

    name = "cpu"

    def __init__(self) -> None:
        import psutil  # imported on the reporter thread's first window, not at `import gputop`

        self._psutil = psutil
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call only sets the baseline
        self._children: dict[int, Any] = {}  # pid -> Process, kept for their cpu_percent baselines
        self._primed = False

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
        return out
