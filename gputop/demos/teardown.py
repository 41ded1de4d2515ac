"""How a demo rank ends: with the ``gputop demo`` that started it, and without the interpreter's teardown."""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Mapping
from typing import NoReturn

from gputop.processes import lifeline

DEMO_PID_ENV = "GPUTOP_DEMO_PID"  # set by `gputop demo` for its job: the process the ranks leave with
LEFT_WITH_THE_DEMO = 1  # a rank's exit status when its demo went first


def leave_with_the_demo(env: Mapping[str, str] = os.environ) -> bool:
    """Tie this rank to the ``gputop demo`` that started its job; False when that is gone already.

    The demo's torchrun gets SIGTERM when the demo dies (PR_SET_PDEATHSIG) and
    stops its ranks, but a SIGTERM that lands while it is still starting them
    loses the ones started so far: torchrun's handler raises before it has kept
    their handles, and the ranks, each in a session of its own, train on: in 4
    of 6 tries here, SIGTERM sent as the first rank appeared, and in CI, both
    ranks of a demo killed just as they started still running 60 s later.  A
    rank started without the variable (by hand) is tied to nothing.
    """
    pid = env.get(DEMO_PID_ENV, "")
    return not pid.isdigit() or lifeline.leave_with(int(pid), code=LEFT_WITH_THE_DEMO)


def exit_without_teardown(code: int = 0) -> NoReturn:
    """Run the exit handlers (gputop's last window and goodbye among them), then leave without finalizing.

    A 2-rank gloo job that has finished, met its ranks at a barrier and destroyed its
    process group still aborts now and then while the interpreter finalizes: "terminate
    called without an active exception", with no Python frame on any thread (a
    ``PYTHONFAULTHANDLER`` dump). On the 2-core development machine, 10-step runs of
    ``tests/support/jobs/ddp_job.py`` with gputop disabled, three at a time, aborted in 6 of
    180; ending them like this, six at a time, none of 120 did (nor 120 more that skipped
    the exit handlers too). The job's work is done by then: the abort only turns its exit
    status, and so a test or the demo, into a failure.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()  # what Python would run before finalizing, in its order
    os._exit(code)
