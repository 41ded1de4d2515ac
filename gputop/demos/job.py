"""The demo's training job under torchrun: started in its own session, always stopped, ranks and all."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Runs torchrun with "SIGTERM me when my parent dies" set (Linux; elsewhere it just
# runs it). The job has a session of its own, so Ctrl-C in the dashboard is ours
# to handle, which also means a closed terminal's SIGHUP never reaches it: when
# tmux or SSH goes away and gputop dies, torchrun would train on, orphaned. It
# stops its ranks on SIGTERM (and each rank also leaves when we have: a SIGTERM
# that lands while torchrun starts them loses them; see gputop/demos/teardown.py).
# Set in a fresh interpreter that then execs, because a preexec_fn in a process
# with threads (ours has the collector's) can deadlock.
_EXEC_WITH_PDEATHSIG = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG, kept across exec
except Exception:
    pass
os.execv(sys.argv[1], sys.argv[1:])
"""


class DemoJob:
    """The bundled training job under torchrun, in its own process group so it is always cleaned up."""

    def __init__(self, *, scenario: str, nproc: int, port: int, seconds: float | None, log_path: Path) -> None:
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "gputop.demos.train", "--scenario", scenario,
        ]  # fmt: skip
        if seconds:
            cmd += ["--seconds", str(seconds)]
        from gputop.demos.teardown import DEMO_PID_ENV

        env = {**os.environ, "GPUTOP_PORT": str(port), "PYTHONUNBUFFERED": "1", DEMO_PID_ENV: str(os.getpid())}
        env.pop("GPUTOP_SOCKET", None)
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _EXEC_WITH_PDEATHSIG, *cmd],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, rank_pids: Sequence[int] = ()) -> None:
        """SIGINT torchrun (it stops its ranks), then SIGTERM, SIGKILL; then any rank left behind.

        torchrun starts each rank in a session of its own, so killing
        torchrun's process group alone can orphan ranks: they are found first.
        """
        ranks = self._descendants() + self._demo_processes(rank_pids)
        if self.proc.poll() is None:
            for sig, grace_s in ((signal.SIGINT, 3.0), (signal.SIGTERM, 3.0), (signal.SIGKILL, 3.0)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, sig)
                if self.wait(grace_s) is not None:
                    break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for rank in ranks:  # orphaned by a launcher that did not get to stop them
            with contextlib.suppress(Exception):
                rank.kill()
        self._log.close()

    @staticmethod
    def _demo_processes(pids: Sequence[int]) -> list[Any]:
        """The given pids that are still demo ranks (a pid reused by another program is left alone)."""
        import psutil

        found = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if "gputop.demos.train" in " ".join(proc.cmdline()):
                    found.append(proc)
        return found

    def _descendants(self) -> list[Any]:
        import psutil

        try:
            return list(psutil.Process(self.proc.pid).children(recursive=True))
        except psutil.Error:
            return []

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(text[-lines:])
