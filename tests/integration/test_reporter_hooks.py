"""The reporter's hooks as torch calls them, in this process: optimizer wrappers and closures (Lightning's), and the
backward's start marked on the autograd node of the model's output (issue #45)."""

from __future__ import annotations

import time
from typing import Any

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
        reporter.thread.sender.close()
    last = reporter.clock.drain()[-1]
    assert last.optimizer_s is not None and last.duration_s is not None, last
    assert last.forward_s is not None and last.forward_s >= 0.01 and last.backward_s is not None, last
    assert last.backward_s >= 0.03, last
    # The closure's 40 ms are forward and backward, not the optimizer's too: the parts add up within the step (an
    # identity of the marks; a bound on the update's own time would be one on a loaded machine's scheduling).
    assert last.optimizer_s + last.forward_s + last.backward_s <= last.duration_s + 1e-9, last


# -- the backward's start (issue #45) -------------------------------------------------------------


def _watched(model: object) -> Reporter:
    """A reporter (not started) watching ``model`` with the backward's start marked, as on a CPU rank off DDP."""
    reporter = Reporter(Address(port=1))
    reporter.attach_model(model)
    reporter.clock.times_phases = reporter.clock.marks_backward = True
    return reporter


def _close(reporter: Reporter) -> None:
    if reporter.side.flops is not None:  # a forward without its optimizer step leaves the counting running
        reporter.side.flops.end()
    for handle in reporter._hook_handles:
        handle.remove()
    reporter.thread.sender.close()


def test_the_scripts_work_between_the_forward_and_backward_is_not_the_backward() -> None:
    """A metric in Python between ``model(x)`` and ``loss.backward()``: outside the phases, and the output, the loss
    and the gradients are those of the same model unwatched."""
    import copy

    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    twin = copy.deepcopy(model)
    reporter = _watched(model)
    try:
        x = torch.randn(8, 16)
        reporter.clock.mark_step()
        out = model(x)
        time.sleep(0.04)  # the script's work: a metric, a log line
        out.sum().backward()
        reporter.clock.mark_step()
        (mark,) = reporter.clock.drain()[-1:]
        twin_out = twin(x)
        twin_out.sum().backward()
    finally:
        _close(reporter)
    gap_s, gaps = reporter.clock.pre_backward
    assert gaps == 1 and gap_s >= 0.04, reporter.clock.pre_backward
    # The step is its forward, the gap and its backward (and what came before the forward): the backward does not
    # hold the gap.  An identity of the marks, not a bound on how long a backward takes on a loaded machine.
    assert mark.backward_s is not None and mark.forward_s is not None and mark.duration_s is not None, mark
    assert mark.forward_s + gap_s + mark.backward_s <= mark.duration_s + 1e-9, (mark, gap_s)
    assert torch.equal(out, twin_out)
    for mine, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        assert mine.grad is not None and theirs.grad is not None and torch.equal(mine.grad, theirs.grad)


@pytest.mark.parametrize("op", ["relu_", "mul_", "add_", "index_put"])
def test_an_in_place_op_on_the_output_still_backpropagates_as_unwatched(op: str) -> None:
    """The pre-hook sits on the node the output came from: an in-place op after the forward puts its own node in
    front, and the gradient still reaches the hooked one, unchanged."""
    import copy

    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    twin = copy.deepcopy(model)
    reporter = _watched(model)

    def run(m: torch.nn.Module) -> torch.Tensor:
        out = m(torch.ones(2, 8))
        if op == "index_put":
            out[0, 1] = 0.0
        else:
            getattr(out, op)(*(() if op == "relu_" else (2.0,)))
        out.pow(2).sum().backward()
        return out

    try:
        out, twin_out = run(model), run(twin)
    finally:
        _close(reporter)
    assert torch.equal(out, twin_out)
    assert model.weight.grad is not None and twin.weight.grad is not None
    assert torch.equal(model.weight.grad, twin.weight.grad)
    assert reporter.clock.pre_backward[1] == 1 and not reporter.clock.backward_pending


def test_evaluation_forwards_hook_nothing_and_the_graph_is_freed_as_before() -> None:
    import gc
    import weakref

    import torch

    model = torch.nn.Linear(8, 4)
    reporter = _watched(model)
    try:
        with torch.no_grad():
            model(torch.ones(2, 8))
        assert not reporter.clock.backward_pending
        x = torch.ones(2, 8)
        saved = weakref.ref(x)  # the graph keeps its input for the weight's gradient
        out = model(x)
        assert reporter.clock.backward_pending
        del out, x  # a forward whose backward never runs (an evaluation with autograd on)
        gc.collect()
        assert saved() is None  # the graph is gone: the hook holds the reporter, never the graph
    finally:
        _close(reporter)


@pytest.mark.parametrize("shape", ["dict", "tuple"])
def test_an_output_of_several_tensors_is_hooked_at_the_first_with_a_gradient(shape: str) -> None:
    import torch

    class TwoHeads(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> object:
            hidden = self.body(x)
            parts = (x.argmax(dim=1), hidden.sum(), hidden)  # an index (no gradient), the loss, the logits
            return dict(zip(("index", "loss", "logits"), parts, strict=True)) if shape == "dict" else parts

    model = TwoHeads()
    reporter = _watched(model)
    try:
        out = model(torch.ones(2, 8))
        time.sleep(0.02)
        loss = out["loss"] if isinstance(out, dict) else out[1]
        loss.backward()
    finally:
        _close(reporter)
    gap_s, gaps = reporter.clock.pre_backward
    assert gaps == 1 and gap_s >= 0.02


@pytest.mark.parametrize("how", ["torch.compile(model)", "model.compile()"])
def test_a_compiled_model_marks_its_backward_and_its_gradients_are_as_unwatched(how: str) -> None:
    import copy

    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    twin = copy.deepcopy(model)
    watched: Any = model
    if how == "model.compile()":
        reporter = _watched(model)  # watched, then compiled in place: dynamo meets the hooks
        model.compile(backend="aot_eager")
    else:
        watched = torch.compile(model, backend="aot_eager")
        reporter = _watched(watched)
    try:
        for _ in range(2):
            out = watched(torch.ones(2, 8))
            time.sleep(0.02)
            out.sum().backward()
        twin_out = twin(torch.ones(2, 8))
        twin_out.sum().backward()
        twin_out = twin(torch.ones(2, 8))
        twin_out.sum().backward()
    finally:
        torch._dynamo.reset()
        _close(reporter)
    gap_s, gaps = reporter.clock.pre_backward
    assert gaps == 2 and gap_s >= 0.04, reporter.clock.pre_backward
    assert torch.allclose(out, twin_out)
    for mine, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        assert mine.grad is not None and theirs.grad is not None and torch.allclose(mine.grad, theirs.grad)


def test_gradient_accumulation_leaves_each_micro_batchs_gap_out() -> None:
    import torch

    model = torch.nn.Linear(8, 4)
    reporter = _watched(model)
    try:
        reporter.clock.mark_step()
        for _ in range(3):
            out = model(torch.ones(2, 8))
            time.sleep(0.015)
            out.sum().backward()
        reporter.clock.mark_step()
    finally:
        _close(reporter)
    mark = reporter.clock.drain()[-1]
    gap_s, gaps = reporter.clock.pre_backward
    assert gaps == 3 and gap_s >= 0.045
    assert mark.backward_s is not None and mark.forward_s is not None and mark.duration_s is not None, mark
    assert mark.forward_s + gap_s + mark.backward_s <= mark.duration_s + 1e-9, (mark, gap_s)


def test_tf32_allowed_after_watch_is_the_peak_the_next_window_reads() -> None:
    """TF32 was read once at ``watch()``: a script that allowed it later (most set it after building the model)
    had its MFU set against float32's peak, 7.4x too low on an H100."""
    import torch

    before = torch.get_float32_matmul_precision()
    reporter = _watched(torch.nn.Linear(4, 4))
    try:
        torch.set_float32_matmul_precision("highest")
        reporter.thread._step_work(0)
        assert reporter.side.facts.get("tf32_matmul") is False
        reporter.side.facts_changed.clear()
        torch.set_float32_matmul_precision("high")  # the script allows TF32 now
        reporter.thread._step_work(0)
        assert reporter.side.facts.get("tf32_matmul") is True and reporter.side.facts_changed.is_set()
    finally:
        torch.set_float32_matmul_precision(before)
        _close(reporter)
