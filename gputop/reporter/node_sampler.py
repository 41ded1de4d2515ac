"""Local rank 0 starts its host's node sampler (``python -m gputop.node``) when the collector is elsewhere.

A collector reads only its own machine's GPUs.  When a rank reports to another
machine, nobody there can read this host's NVML, so local rank 0 starts one
child process that does (the reporter itself must not load pynvml: NVML's
driver calls would run, and could hang, inside the training process).

The rule (``GPUTOP_NODE_SAMPLER``):

- ``auto`` (default): started by the rank whose ``local_rank`` is 0, once its
  reporter has connected over TCP and the connection's two ends have different
  addresses, neither of them loopback: the collector is on another machine (or
  in another network namespace, whose GPUs it may not see either; a GPU listed
  twice is shown once, the collector's own first).
- ``off`` / ``0``: never (a ``gputop agent`` already runs on every node).
- ``on`` / ``1``: local rank 0 starts it whatever the address (a collector on
  this machine without access to its GPUs, e.g. in a container).

What the rank pays: one ``fork+exec`` on the reporter thread (never the
training thread), then nothing; the child leaves when the rank's process has
exited (``gputop.processes.lifeline``) and runs in a session of its own, so a terminal's
Ctrl-C reaches the rank, not the sampler, and the sampler still goes with it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gputop import settings
from gputop.address import Address

if TYPE_CHECKING:
    import subprocess

MODE_ENV = settings.NODE_SAMPLER.env


def mode(env: Mapping[str, str] = os.environ) -> str:
    """``auto``, ``on`` or ``off`` from ``GPUTOP_NODE_SAMPLER`` (anything unknown reads as auto)."""
    return settings.NODE_SAMPLER.value(env)


def wanted(chosen: str, local_rank: int, remote_link: bool | None) -> bool:
    """Whether this rank should start the node sampler, given its link to the collector."""
    if chosen == "off" or local_rank != 0:
        return False
    return chosen == "on" or remote_link is True


def command(address: Address, parent_pid: int) -> list[str]:
    """The child's command line: this interpreter, the collector's address, the rank it dies with."""
    argv = [sys.executable, "-m", "gputop.node", "--parent-pid", str(parent_pid)]
    if address.is_tcp:
        host = f"[{address.host}]" if ":" in address.host else address.host
        argv += ["--addr", f"{host}:{address.port}"]
    return argv


class NodeSamplerChild:
    """The one child process; started at most once per rank, from the reporter thread."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.spawn_s: float | None = None  # the fork+exec's wall time, on the reporter thread
        self.exit_code: int | None = None

    def start(self, address: Address, parent_pid: int) -> None:
        """Start it; raises OSError (or ValueError without an interpreter path) when it cannot."""
        if not sys.executable:
            raise ValueError("no Python interpreter path (sys.executable) to start it with")
        import subprocess  # here, not at import: 3 ms that every training process would pay, most for nothing

        started = time.perf_counter()
        self.process = subprocess.Popen(
            command(address, parent_pid),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # its one-line refusals go to stderr, the rank's own
            close_fds=True,
            start_new_session=True,
        )
        self.spawn_s = time.perf_counter() - started

    def exited(self) -> int | None:
        """Its exit code once it has ended (reaped here, so no zombie waits for the rank's end)."""
        if self.process is not None and self.exit_code is None:
            self.exit_code = self.process.poll()
        return self.exit_code

    def stop(self) -> None:
        """End it with the reporter (it would die with the process anyway; this is sooner).

        No wait: the rank is exiting, and its exit hands the child to init, which reaps it.
        """
        process = self.process
        if process is not None and process.poll() is None:
            with contextlib.suppress(OSError):
                process.terminate()
