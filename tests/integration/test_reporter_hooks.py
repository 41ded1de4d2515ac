"""The reporter's optimizer hooks as torch calls them, in this process: wrappers and closures (Lightning's)."""

from __future__ import annotations

import time

import pytest

from gputop.address import Address
from gputop.reporter.clock import StepClock
from gputop.reporter.reporter import Reporter
from tests.support.processes import needs_torch

pytestmark = needs_torch


def test_an_optimizer_stepping_another_is_timed_from_the_outer_hooks() -> None:
    """A wrapper (ZeroRedundancyOptimizer, a Lookahead) does its own work, then steps its inner optimizer: the
    optimizer phase holds both, not only the inner step (whose hooks fire inside the outer one's)."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    clock = StepClock()
    clock.times_optimizer = True
    weight = torch.nn.Parameter(torch.zeros(4))
    inner = torch.optim.SGD([weight], lr=0.1)

    class Wrapper(torch.optim.Optimizer):
        def __init__(self) -> None:
            super().__init__([weight], {})

        def step(self, closure: object = None) -> None:  # type: ignore[override, unused-ignore]  # not where torch is not installed
            time.sleep(0.03)  # its own work: a broadcast, a slow-weights update
            inner.step()

    handles = [
        register_optimizer_step_pre_hook(lambda *_: clock.optimizer_started()),
        register_optimizer_step_post_hook(lambda *_: clock.optimizer_done()),
    ]
    try:
        weight.grad = torch.ones(4)
        Wrapper().step()
        clock.mark_step()
    finally:
        for handle in handles:
            handle.remove()
    (mark,) = clock.drain()
    assert mark.optimizer_s is not None and mark.optimizer_s >= 0.03, mark


def test_an_optimizer_closure_is_the_steps_forward_and_backward_not_the_optimizers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lightning runs forward and backward inside optimizer.step(closure): the optimizer phase is the update alone,
    the closure's loss comes back to the optimizer unchanged, and its backward ends where the closure does."""
    import torch

    reporter = Reporter(Address(port=1))  # not started: its hooks are called as torch calls them
    reporter._install_step_hook()
    reporter.clock.times_phases = True
    weight = torch.nn.Parameter(torch.zeros(4))
    optimizer = torch.optim.SGD([weight], lr=0.1)

    def closure() -> torch.Tensor:
        reporter.clock.forward_started(time.perf_counter())
        time.sleep(0.01)
        reporter.clock.forward_done(time.perf_counter())
        loss = (weight - 1).pow(2).sum()
        loss.backward()
        time.sleep(0.03)  # a slow backward
        return loss

    try:
        for _ in range(2):
            optimizer.zero_grad()
            returned = optimizer.step(closure)
            assert returned is not None and float(returned) >= 0  # SGD hands the closure's loss back
    finally:
        reporter.shutdown()
        for handle in reporter._hook_handles:
            handle.remove()
        reporter.sender.close()
    last = reporter.clock.drain()[-1]
    assert last.optimizer_s is not None and last.optimizer_s < 0.01, last
    assert last.forward_s is not None and last.forward_s >= 0.01 and last.backward_s is not None, last
    assert last.backward_s >= 0.03, last
