"""Runs the user's ``--on-finding`` command for each alert, with the alert as JSON on its stdin.

The command goes through the shell (so ``curl ... -d @-`` or ``mail -s ...``
work as typed) in a process of its own; the recorder never waits for it.  A
command still running after ``COMMAND_TIMEOUT_S`` is killed, and one that
fails is logged on stderr with its exit code: a broken webhook must not stop
the recording.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import time

from gputop.diagnose.alerts import Alert

log = logging.getLogger("gputop.alerts")

COMMAND_TIMEOUT_S = 30.0


class AlertCommand:
    """One shell command, started once per alert."""

    def __init__(self, command: str, *, price_per_hour: float | None = None) -> None:
        """``price_per_hour``: a GPU-hour's price, to put the findings' waste in money."""
        self.command = command
        self.price_per_hour = price_per_hour
        self.started = 0
        self._running: list[tuple[subprocess.Popen[bytes], float, str]] = []

    def run(self, alert: Alert) -> None:
        """Start the command with the alert on stdin; return at once."""
        payload = json.dumps(alert.to_dict(self.price_per_hour)).encode() + b"\n"
        what = f"{alert.kind} {alert.finding.cause}"
        try:
            proc = subprocess.Popen(
                self.command, shell=True, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True
            )
        except OSError as exc:
            log.warning("--on-finding command could not start for %s: %s", what, exc)
            return
        self.started += 1
        try:
            assert proc.stdin is not None
            proc.stdin.write(payload)  # one small object: fits the pipe's buffer, never blocks
            proc.stdin.close()
        except OSError:
            pass  # the command did not read its stdin; that is its choice
        self._running.append((proc, time.monotonic(), what))
        self.reap()

    def reap(self) -> None:
        """Collect finished commands, say which failed, kill those past their time."""
        still = []
        for proc, started_s, what in self._running:
            code = proc.poll()
            if code is None and time.monotonic() - started_s > COMMAND_TIMEOUT_S:
                with contextlib.suppress(OSError):
                    proc.kill()
                code = proc.wait()
                log.warning("--on-finding command for %s killed after %.0f s", what, COMMAND_TIMEOUT_S)
            elif code is None:
                still.append((proc, started_s, what))
            elif code != 0:
                log.warning("--on-finding command for %s exited with code %d", what, code)
        self._running = still

    def wait(self, timeout_s: float = 5.0) -> None:
        """At the end of a recording: give running commands a little time to finish."""
        deadline = time.monotonic() + timeout_s
        while self._running and time.monotonic() < deadline:
            time.sleep(0.05)
            self.reap()
