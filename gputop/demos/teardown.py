"""Leaving a finished gloo job without the interpreter's own teardown, where gloo now and then aborts."""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn


def exit_without_teardown(code: int = 0) -> NoReturn:
    """Run the exit handlers (gputop's last window and goodbye among them), then leave without finalizing.

    A 2-rank gloo job that has finished, met its ranks at a barrier and destroyed its
    process group still aborts now and then while the interpreter finalizes: "terminate
    called without an active exception", with no Python frame on any thread (a
    ``PYTHONFAULTHANDLER`` dump). On the 2-core development machine, 10-step runs of
    ``tests/jobs/ddp_job.py`` with gputop disabled, three at a time, aborted in 6 of
    180; ending them like this, six at a time, none of 120 did (nor 120 more that skipped
    the exit handlers too). The job's work is done by then: the abort only turns its exit
    status, and so a test or the demo, into a failure.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()  # what Python would run before finalizing, in its order
    os._exit(code)
