"""What gputop costs the rank it runs in, as each window says: the reporter thread's CPU, the hooks' time, the bytes.

The reporter thread's CPU is its own ``time.thread_time()`` between windows,
read on that thread.  The training thread's time inside gputop (step marks and
tracked batches) is not timed per call: a clock read per step would cost about
what a step mark costs, and a GIL handoff that fell inside the mark would be
counted as gputop's.  ``calibrate`` measures, once, what one step mark and one
tracked batch cost on a private clock, and ``SelfCost`` multiplies by the calls.
docs/architecture.md, "gputop accounts for its own cost".
"""

from __future__ import annotations

import time
from typing import Any

from gputop.reporter.clock import StepClock, TrackedLoader
from gputop.reporter.sender import Sender


class SelfCost:
    """Each window's ``reporter_cpu_s``, ``hook_s`` and ``sent_bytes``; read on the reporter thread only."""

    def __init__(self, sender: Sender) -> None:
        self._sender = sender
        # (reporter thread CPU, bytes sent) at the last window; a new thread's CPU time starts at 0.
        self._cost_mark = (0.0, 0)
        self._call_cost_s: tuple[float, float] | None = None  # a step mark's and a tracked batch's cost

    def since_last_window(self, marks: int, batches: int) -> dict[str, Any]:
        """What gputop cost this rank since the last window: its thread's CPU, its hooks, its bytes.

        The hooks' time is their calibrated per-call cost times the calls,
        measured once on this thread; the calibration's own CPU lands in
        ``reporter_cpu_s`` like everything else this thread does.
        """
        if self._call_cost_s is None:
            self._call_cost_s = calibrate()
        mark_s, batch_s = self._call_cost_s
        cpu_s, sent = time.thread_time(), self._sender.sent_bytes
        before, self._cost_mark = self._cost_mark, (cpu_s, sent)
        return {
            "reporter_cpu_s": max(cpu_s - before[0], 0.0),
            "hook_s": marks * mark_s + batches * batch_s,
            "sent_bytes": max(sent - before[1], 0),
        }


def calibrate(repeats: int = 7, calls: int = 300) -> tuple[float, float]:
    """What a step mark (the optimizer step timed too) and a tracked batch cost the training thread: (s, s).

    Measured on a private clock, best of ``repeats`` runs of ``calls`` calls,
    as ``timeit`` does: the code's own cost on this CPU in this interpreter.
    Short runs (~0.2 ms each, inside one GIL switch interval), several of them:
    on a busy machine the best of many short runs is the code's cost, where
    3 runs of 1,000 calls read 0.9-1.7 µs for the same 1 µs of code.
    Timing each real call instead would cost a clock read per step and count
    whatever ran while the training thread waited for the GIL inside it.
    """
    perf = time.perf_counter
    clock = StepClock()
    items = list(range(calls))
    mark = batch = float("inf")
    for _ in range(repeats):
        start = perf()
        for _ in items:  # a step as the optimizer's hooks mark it: its step timed, then the mark (one clock read)
            clock.optimizer_started()
            clock.optimizer_done(True)
        mark = min(mark, (perf() - start) / calls)
        clock.drain()
        start = perf()
        for _ in items:
            pass
        plain = perf() - start
        start = perf()
        for _ in TrackedLoader(items, clock):
            pass
        batch = min(batch, max(perf() - start - plain, 0.0) / calls)
    return mark, batch
