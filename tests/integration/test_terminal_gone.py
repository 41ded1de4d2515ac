"""A dashboard whose terminal goes away without a SIGHUP leaves, and the demo's job with it."""

from __future__ import annotations

import contextlib
import os
import pty
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from tests.support.processes import needs_torch


def _on_a_terminal(args: list[str]) -> tuple[subprocess.Popen[bytes], int, list[bytes]]:
    """gputop on a fresh pty, in a session of its own: closing the pty's master sends it no SIGHUP."""
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"}
    env.pop("CI", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gputop", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,  # no controlling terminal: a hangup is not signalled, as under tmux + make
    )
    os.close(slave)
    drawn: list[bytes] = []

    def drain() -> None:  # a terminal reads what it is sent, or the app's writes would block on a full pty
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 65536):
                drawn.append(chunk)

    threading.Thread(target=drain, daemon=True).start()
    return proc, master, drawn


def _is_rank(proc: psutil.Process) -> bool:
    """A training process of the demo (not torchrun, nor its elastic agent's helper)."""
    cmd = " ".join(proc.cmdline())
    return "gputop.demos.train" in cmd and "torch.distributed.run" not in cmd and proc.name() != "pt_elastic"


def _wait_drawn(drawn: list[bytes], text: bytes, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in b"".join(drawn):
            return True
        time.sleep(0.1)
    return False


def test_the_dashboard_exits_when_its_terminal_is_closed(tmp_path) -> None:
    proc, master, drawn = _on_a_terminal(["attach", "--socket", str(tmp_path / "gputop.sock")])
    try:
        assert _wait_drawn(drawn, b"waiting for a run", 60), f"never drew: {b''.join(drawn)[-300:]!r}"
        os.close(master)  # the terminal window closes
        code = proc.wait(timeout=20)
        assert code != 0, "a dashboard that lost its terminal exits like a hangup, not as a clean quit"
    finally:
        proc.kill()


@needs_torch
@pytest.mark.slow
def test_the_demo_job_stops_when_the_terminal_is_closed() -> None:
    proc, master, drawn = _on_a_terminal(["demo", "--scenario", "healthy"])
    gputop = psutil.Process(proc.pid)
    try:
        assert _wait_drawn(drawn, b"gputop", 60), f"never drew: {b''.join(drawn)[-300:]!r}"
        ranks: list[psutil.Process] = []
        deadline = time.monotonic() + 120
        while len(ranks) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
            with contextlib.suppress(psutil.Error):
                ranks = [p for p in gputop.children(recursive=True) if _is_rank(p)]
        assert len(ranks) == 2, f"the demo's 2 ranks were not found: {ranks}"
        os.close(master)
        proc.wait(timeout=30)
        _, alive = psutil.wait_procs(ranks, timeout=30)
        assert not alive, f"ranks left training after the terminal closed: {[p.pid for p in alive]}"
    finally:
        proc.kill()
        for p in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                p.kill()


def test_sigterm_closes_the_dashboard_and_gives_the_terminal_back(tmp_path) -> None:
    """`kill` (SIGTERM) leaves as `q` does: the alternate screen and mouse reporting are switched off."""
    proc, master, drawn = _on_a_terminal(["attach", "--socket", str(tmp_path / "gputop.sock")])
    try:
        assert _wait_drawn(drawn, b"waiting for a run", 60), f"never drew: {b''.join(drawn)[-300:]!r}"
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
        time.sleep(0.2)  # the last bytes through the pty
        tail = b"".join(drawn)[-2000:]
        assert code == 128 + signal.SIGTERM, f"exit code {code}"
        assert b"\x1b[?1049l" in tail, f"the alternate screen was not left: {tail[-300:]!r}"
        assert b"\x1b[?1000l" in tail, f"mouse reporting was not switched off: {tail[-300:]!r}"
    finally:
        proc.kill()
        os.close(master)
