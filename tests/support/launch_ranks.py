"""Start N ranks of a training script directly, as Slurm's srun or a cluster's own launcher does.

    python tests/support/launch_ranks.py NPROC SCRIPT [ARGS...]

Each rank gets the environment torchrun would give it (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` of a free
loopback port, ``OMP_NUM_THREADS=1`` unless set) and this process's standard
output.  What it leaves out is torchrun's agent: a second import of torch and a
rendezvous, ~2.5 s of CPU and ~2.5 s of wall time per job on two cores, which
is most of what ~60 test jobs paid before their first step.  gputop names such a
run by its master port (``gputop.reporter.facts.run_id``), as it names an srun step.

As torchrun does: the first rank to fail stops the others, and the launcher exits
with its code; SIGTERM and SIGINT are passed to every rank; and a rank never
outlives the launcher (the kernel kills it when the launcher dies, however it dies).
This file imports nothing outside the standard library, so it starts in milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 10.0  # what a rank gets to leave after SIGTERM before SIGKILL (torchrun's default is 30)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_port() -> int:  # processes.free_port's twin: this script imports nothing of the tests (nor pytest)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _stop(ranks: list[subprocess.Popen[bytes]], sig: int = signal.SIGTERM) -> None:
    for rank in ranks:
        if rank.poll() is None:
            rank.send_signal(sig)
    deadline = time.monotonic() + STOP_GRACE_S
    for rank in ranks:
        try:
            rank.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rank.kill()
            rank.wait()


def _exit_status(code: int) -> int:
    """A rank's exit code as a shell reports it: a rank killed by signal N is 128 + N."""
    return code if code >= 0 else 128 - code


def main(argv: list[str]) -> int:
    nproc, script, args = int(argv[0]), argv[1], argv[2:]
    base = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": "0",
    }
    base.setdefault("OMP_NUM_THREADS", "1")
    ranks = [
        subprocess.Popen(
            [sys.executable, script, *args],
            env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            preexec_fn=_die_with_parent,  # the launcher has no threads: a pre-exec hook is safe
        )
        for rank in range(nproc)
    ]
    stopping = False

    def pass_on(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for rank in ranks:
            if rank.poll() is None:
                rank.send_signal(signum)

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGINT, pass_on)
    while True:
        codes = [rank.poll() for rank in ranks]
        failed = [code for code in codes if code not in (None, 0)]
        if failed and not stopping:
            print(f"launch_ranks: a rank exited {failed[0]}; stopping the others", file=sys.stderr, flush=True)
            _stop(ranks)
            return _exit_status(failed[0])
        if all(code is not None for code in codes):
            return next((_exit_status(code) for code in codes if code), 0)
        time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
