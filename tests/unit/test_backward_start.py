"""The backward's start, where it happens (issue #45): the gap between a training forward's end and its backward's
start is the script's time, not the model's backward, for the phases from hooks and for DDP's logger on the CPU.

Stand-ins only (no torch): an output whose ``grad_fn`` is a node that keeps the pre-hook it is given, fired by
the test where the autograd engine would fire it.  The same hooks under torch itself (in-place ops on the output,
no_grad, torch.compile, gradient accumulation) are tests/integration/test_reporter_hooks.py's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gputop.address import Address
from gputop.reporter.clock import StepClock, StepMark, output_node
from gputop.reporter.probes.ddp import DdpProbe
from gputop.reporter.reporter import Reporter
from tests.unit.test_ddp_probe import LoggingData


class Node:
    """An autograd node: keeps the pre-hooks registered on it; ``fire`` is the gradient reaching it."""

    def __init__(self) -> None:
        self.prehooks: list[Callable[[Any], Any]] = []

    def register_prehook(self, hook: Callable[[Any], Any]) -> object:
        self.prehooks.append(hook)
        return object()

    def fire(self) -> list[Any]:
        return [hook(("grad",)) for hook in self.prehooks]


class Output:
    """A tensor as the hooks see it: a ``grad_fn`` (None: no gradient flows into it)."""

    def __init__(self, node: Node | None) -> None:
        self.grad_fn = node


def phased_clock() -> StepClock:
    clock = StepClock()
    clock.times_phases = clock.marks_backward = True
    return clock


def one_step(clock: StepClock, t: float, gap_s: float, backward_s: float, hooked: bool = True) -> float:
    """A forward of 10 ms at ``t``, then ``gap_s`` of the script's work, then ``backward_s`` of backward: its end."""
    clock.forward_started(t)
    clock.forward_end_s = t + 0.010
    clock.forward_done(t + 0.010)
    clock.backward_pending = hooked  # the reporter's post-hook put a pre-hook on the output's node
    if hooked:
        clock.backward_started(t + 0.010 + gap_s)
    return t + 0.010 + gap_s + backward_s


def test_the_gap_before_the_backward_is_left_out_of_the_backward_and_counted_apart() -> None:
    clock = phased_clock()
    clock.mark_step(now=0.0)
    end = one_step(clock, 1.0, gap_s=0.100, backward_s=0.020)
    clock.mark_step(now=end)
    mark = clock.drain()[-1]
    assert mark.forward_s == pytest.approx(0.010) and mark.backward_s == pytest.approx(0.020)
    assert clock.pre_backward == pytest.approx((0.100, 1))
    assert not clock.backward_pending


def test_a_backward_the_hook_never_sees_begin_is_timed_from_the_forwards_end_as_before() -> None:
    """The loss does not use the output's first tensor, or no node could be hooked: nothing is taken out."""
    clock = phased_clock()
    clock.mark_step(now=0.0)
    end = one_step(clock, 1.0, gap_s=0.100, backward_s=0.020, hooked=False)
    clock.mark_step(now=end)
    assert clock.drain()[-1].backward_s == pytest.approx(0.120)
    assert clock.pre_backward == (0.0, 0)


def test_only_the_first_pre_hook_after_a_forward_counts() -> None:
    """Several hooked outputs, or a graph backpropagated twice (retain_graph): the backward began once."""
    clock = phased_clock()
    clock.mark_step(now=0.0)
    end = one_step(clock, 1.0, gap_s=0.050, backward_s=0.030)
    clock.backward_started(1.0 + 0.010 + 0.070)  # a second pre-hook, later in the same backward
    clock.mark_step(now=end)
    assert clock.drain()[-1].backward_s == pytest.approx(0.030)
    assert clock.pre_backward == pytest.approx((0.050, 1))


def test_each_micro_batchs_gap_is_left_out_under_gradient_accumulation() -> None:
    clock = phased_clock()
    clock.mark_step(now=0.0)
    t = 1.0
    for _ in range(4):
        t = one_step(clock, t, gap_s=0.005, backward_s=0.020)
    clock.mark_step(now=t)
    mark = clock.drain()[-1]
    assert mark.forward_s == pytest.approx(0.040) and mark.backward_s == pytest.approx(0.080)
    assert clock.pre_backward == pytest.approx((0.020, 4))


def test_a_collective_in_the_gap_is_exposed_comm_and_not_taken_from_the_backward_again() -> None:
    """A loss all-reduced for the log between the forward and backward(): its wait is the step's exposed comm,
    the backward is its own span's time less its own waits, and the rest of the gap is "other"."""
    clock = phased_clock()
    clock.mark_step(now=1.0)
    clock.forward_started(1.0)
    clock.forward_end_s = 1.010
    clock.forward_done(1.010)
    clock.backward_pending = True
    clock.comm_exposed_s += 0.030  # the script's all-reduce, inside the gap
    clock.backward_started(1.060)
    clock.comm_exposed_s += 0.015  # a wait inside the backward (FSDP2's reduce-scatter)
    clock.mark_step(now=1.100)
    mark = clock.drain()[-1]
    assert mark.backward_s == pytest.approx(0.040 - 0.015)
    assert mark.exposed_comm_s == pytest.approx(0.045)
    step = 1.100 - 1.0
    other = step - (mark.forward_s or 0) - (mark.backward_s or 0) - (mark.exposed_comm_s or 0)
    assert other == pytest.approx(0.050 - 0.030)  # the gap less its collective


def test_a_pre_hook_outside_a_backward_span_only_counts_the_gap() -> None:
    """Without phases from hooks (DDP's logger times them), the pre-hook only adds to the gaps DDP's probe reads."""
    clock = StepClock()
    clock.marks_backward = True
    clock.forward_end_s = 2.0
    clock.backward_pending = True
    clock.backward_started(2.025)
    assert clock.pre_backward == pytest.approx((0.025, 1))
    clock.mark_step(now=2.1)
    assert clock.drain()[-1].backward_s is None


# -- the output's node ---------------------------------------------------------------------------


class Raising:
    @property
    def grad_fn(self) -> Any:
        raise RuntimeError("a user's object whose attribute raises")


@pytest.mark.parametrize("shape", ["tensor", "tuple", "list", "dict", "namedtuple-like tuple", "first without grad"])
def test_the_outputs_node_is_its_first_tensor_with_a_grad_fn(shape: str) -> None:
    node = Node()
    hooked = Output(node)
    outputs = {
        "tensor": hooked,
        "tuple": (hooked, Output(Node())),
        "list": [hooked],
        "dict": {"loss": hooked, "logits": Output(Node())},
        "namedtuple-like tuple": type("Pair", (tuple,), {})((hooked, None)),
        "first without grad": (Output(None), 3, hooked),
    }
    assert output_node(outputs[shape]) is node


@pytest.mark.parametrize("output", [None, 3, "text", (), [], {}, (Output(None),), Output(None), Raising()])
def test_an_output_no_gradient_flows_into_has_no_node(output: object) -> None:
    assert output_node(output) is None


# -- the reporter's forward post-hook ------------------------------------------------------------


@pytest.fixture
def reporter() -> Iterator[Reporter]:
    made = Reporter(Address(port=1), window_s=0.5)  # not started: its hooks are called as torch calls them
    made.side.grad_enabled = lambda: True
    made.clock.marks_backward = True
    try:
        yield made
    finally:
        made.thread.sender.close()


def test_a_training_forward_hooks_its_outputs_node_and_the_gradient_reaching_it_marks_the_backward(
    reporter: Reporter,
) -> None:
    node = Node()
    output = Output(node)
    assert reporter._on_forward_done(object(), (), output) is None  # the output is returned untouched
    assert len(node.prehooks) == 1 and reporter.clock.backward_pending
    assert node.fire() == [None]  # the gradient passes unchanged
    assert reporter.clock.pre_backward[1] == 1 and not reporter.clock.backward_pending


def test_no_hook_without_a_training_forward_a_gradient_or_the_need(reporter: Reporter) -> None:
    node = Node()
    reporter.side.grad_enabled = lambda: False  # evaluation, no_grad
    reporter._on_forward_done(object(), (), Output(node))
    reporter.side.grad_enabled = lambda: True
    reporter._on_forward_done(object(), (), Output(None))  # nothing to backpropagate into
    reporter.clock.marks_backward = False  # on CUDA, or no phase timed on the CPU from it
    reporter._on_forward_done(object(), (), Output(node))
    assert node.prehooks == [] and not reporter.clock.backward_pending


def test_under_ddp_only_the_forwards_that_synchronise_are_hooked(reporter: Reporter) -> None:
    """DDP's logger times only the synchronising micro-batch: a no_sync() forward's gap is in no DDP backward."""

    class Ddp:
        require_backward_grad_sync = False

    reporter._sync_forwards_only = True
    node = Node()
    reporter._on_forward_done(Ddp(), (), Output(node))
    assert node.prehooks == []
    Ddp.require_backward_grad_sync = True
    reporter._on_forward_done(Ddp(), (), Output(node))
    assert len(node.prehooks) == 1


def test_a_node_that_refuses_the_hook_changes_nothing_and_raises_nothing(reporter: Reporter) -> None:
    class Refusing(Node):
        def register_prehook(self, hook: Callable[[Any], Any]) -> object:
            raise RuntimeError("an older torch, a node of another kind")

    reporter._on_forward_done(object(), (), Output(Refusing()))
    assert not reporter.clock.backward_pending


def test_a_forked_child_hooks_nothing(reporter: Reporter) -> None:
    """A DataLoader worker inherits the hooks: the at-fork flag keeps them from hooking anything there."""
    node = Node()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        reporter._on_forward_done(object(), (), Output(node))
        os.write(write, f"{reporter._forked} {len(node.prehooks)}".encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 100).decode() == "True 0"
    os.close(read)


# -- DDP's backward on the CPU -------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_rate_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUTOP_DDP_SAMPLE_RATE", raising=False)  # DDP's probe averages at its CPU rate, 1


def ddp_window(probe: DdpProbe, clock: StepClock, ddp: LoggingData, gaps_ms: list[float]) -> dict[str, Any]:
    """One iteration per gap, each with DDP's 20-ms backward (which holds the gap), then the window's read."""
    for gap_ms in gaps_ms:
        clock.forward_end_s = 10.0
        clock.backward_pending = True
        clock.backward_started(10.0 + gap_ms / 1e3)
        ddp.step(10, 20 + gap_ms, 8, 6)
    return probe.read([])


def test_ddps_backward_on_the_cpu_is_less_the_windows_mean_gap() -> None:
    clock, ddp = StepClock(), LoggingData()
    probe = DdpProbe(ddp, on_cpu=True, clock=clock)
    first = ddp_window(probe, clock, ddp, [100.0, 100.0, 40.0])
    assert first["backward_s"] == pytest.approx(0.020) and first["forward_s"] == pytest.approx(0.010)
    assert first["overlap_s"] == pytest.approx(0.006)  # the exchange's figures are DDP's as it logs them
    second = ddp_window(probe, clock, ddp, [5.0])
    assert second["backward_s"] == pytest.approx(0.020)


def test_ddps_backward_is_as_logged_where_no_start_was_seen_or_on_cuda() -> None:
    clock, ddp = StepClock(), LoggingData()
    probe = DdpProbe(ddp, on_cpu=True, clock=clock)
    ddp.step(10, 120, 8, 6)  # no pre-hook fired (an older torch, an output the loss does not use)
    assert probe.read([])["backward_s"] == pytest.approx(0.120)
    cuda_clock, cuda_ddp = StepClock(), LoggingData()
    on_cuda = DdpProbe(cuda_ddp, on_cpu=False, clock=cuda_clock)
    assert ddp_window(on_cuda, cuda_clock, cuda_ddp, [100.0])["backward_s"] == pytest.approx(0.120)


def test_ddps_backward_less_the_gap_is_never_negative() -> None:
    clock, ddp = StepClock(), LoggingData()
    probe = DdpProbe(ddp, on_cpu=True, clock=clock)
    clock.forward_end_s, clock.backward_pending = 10.0, True
    clock.backward_started(10.2)  # a gap longer than DDP's span: the reads fell between an iteration's parts
    ddp.step(10, 20, 8, 6)
    assert probe.read([])["backward_s"] == 0.0


def test_a_mark_carries_no_new_field() -> None:
    """The gap is no field of the step mark or the window: the step mark is as cheap as it was, and the wire as
    it was (recordings of older reporters read the same)."""
    assert len(StepMark._fields) == 11
