"""A read the reporter thread waits for at most a bound (gputop/reporter/bounded.py), and DDP's probe over it.

DDP's logging data takes the reducer's lock, which the training thread holds while DDP's backward waits for its
all-reduce: in a hang the reporter thread that read it went silent for good.  A held ``threading.Lock`` stands for
the reducer's mutex here; tests/integration/test_hang_collectives.py has the real gloo job.
"""

from __future__ import annotations

import threading
import time

import pytest

from gputop.reporter.bounded import BoundedCall, Busy
from gputop.reporter.probes.ddp import BUSY, READ_BOUND_S, DdpProbe


def test_a_call_that_blocks_is_left_after_the_bound_and_no_second_one_piles_up_behind_it() -> None:
    reducer = threading.Lock()
    reducer.acquire()  # the training thread, in DDP's all-reduce
    calls = BoundedCall("test-read", bound_s=0.1)
    started = time.monotonic()
    with pytest.raises(Busy):
        calls.call(lambda: reducer.acquire() and reducer.release())
    assert time.monotonic() - started < 1.0
    with pytest.raises(Busy):  # still blocked: not started again, at once
        calls.call(lambda: 42)
    reducer.release()  # the exchange ends
    deadline = time.monotonic() + 5
    while calls.blocked and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls.call(lambda: 42) == 42
    assert [t.name for t in threading.enumerate()].count("test-read") == 1


def test_an_exception_in_the_call_reaches_the_caller() -> None:
    counters: dict[str, int] = {}
    with pytest.raises(KeyError):
        BoundedCall("test-raise", bound_s=1.0).call(lambda: counters["missing"])


class DdpInAnExchange:
    """What the probe reads of a DistributedDataParallel whose reducer's lock is held."""

    def __init__(self) -> None:
        self.reducer = threading.Lock()

    def _set_ddp_runtime_logging_sample_rate(self, rate: int) -> None:
        pass

    def _get_ddp_logging_data(self) -> dict[str, int]:
        with self.reducer:
            return {"iteration": 0}


def test_ddps_probe_never_waits_on_the_reducer_the_training_thread_holds() -> None:
    model = DdpInAnExchange()
    probe = DdpProbe(model, on_cpu=True)
    model.reducer.acquire()
    started = time.monotonic()
    assert probe.read([]) == {} and probe.not_measured == BUSY
    assert probe.read([]) == {}  # the window after: still no wait
    took_s = time.monotonic() - started
    assert took_s < READ_BOUND_S + 1.0, f"the reporter thread waited {took_s:.2f} s"
    model.reducer.release()
