"""A training step's FLOPs, counted once per input shape (gputop/reporter/flops.py): against counts by hand.

Each model's count is compared with its matrix work counted by hand from the layers' sizes (docs/mfu.md):
exact for matrix multiplications and convolutions, and for attention up to the recomputation of the scores that
a fused attention kernel's backward does.  The counter is driven as the reporter's hooks drive it: a forward
pre-hook calls ``on_forward(shape_key(...))``, the optimizer's pre-hook ``end()``, the step mark ``take_step()``.
"""

from __future__ import annotations

import itertools
import threading
import types
from typing import Any, ClassVar

import pytest

torch = pytest.importorskip("torch")

from torch import Tensor, nn  # noqa: E402
from torch.optim import Optimizer  # noqa: E402
from torch.utils._python_dispatch import _get_current_dispatch_mode  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from gputop.reporter import flop_formulas, flop_mode, flops  # noqa: E402
from gputop.reporter.device_peak import measure_cpu_peak, tf32_modes  # noqa: E402
from gputop.reporter.flops import NOT_YET, FlopCounter, shape_key  # noqa: E402


class Driven:
    """A model and its optimizer with the counter hooked where the reporter hooks it."""

    def __init__(self, model: nn.Module, counter: FlopCounter | None = None) -> None:
        self.model = model
        self.counter = counter or FlopCounter()
        self.optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        self.counting_seen: list[bool] = []  # whether a counting ran, as each training forward ended
        model.register_forward_pre_hook(self._pre, with_kwargs=True)
        model.register_forward_hook(self._post)

    def _pre(self, module: Any, args: Any, kwargs: Any) -> None:
        if torch.is_grad_enabled():
            self.counter.on_forward(shape_key(args, kwargs))

    def _post(self, module: Any, args: Any, output: Any) -> None:
        self.counting_seen.append(self.counter.counting)
        if torch.is_grad_enabled():
            self.counter.forward_done()

    def step(self, *batches: Tensor) -> tuple[int | None, bool]:
        """One optimizer step over these micro-batches (gradient accumulation when several)."""
        for batch in batches:
            self.model(batch).float().pow(2).mean().backward()
        self.counter.end()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return self.counter.take_step()


def linear_stack(dims: list[int]) -> nn.Module:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(dims)):
        layers += [nn.Linear(a, b)] + ([nn.GELU()] if i < len(dims) - 2 else [])
    return nn.Sequential(*layers)


def linear_hand_count(batch: int, dims: list[int], input_needs_grad: bool = False) -> int:
    """Forward 2*B*in*out a layer; backward twice that (input and weight gradients), less the first layer's
    input gradient where the batch needs none."""
    forward = sum(2 * batch * a * b for a, b in itertools.pairwise(dims))
    first_input_grad = 2 * batch * dims[0] * dims[1]
    return 3 * forward - (0 if input_needs_grad else first_input_grad)


def test_a_linear_stack_is_counted_exactly_as_by_hand() -> None:
    torch.manual_seed(0)
    dims, batch = [32, 64, 48, 16], 8
    driven = Driven(linear_stack(dims))
    got, counted = driven.step(torch.randn(batch, dims[0]))
    assert counted
    assert got == linear_hand_count(batch, dims)
    assert driven.counter.count() == (got, "")
    assert driven.counter.mix() == {"float32": 1.0}


def test_matrix_work_beside_the_model_is_not_its_flops() -> None:
    """A metric of matrix work between the forward and the backward, and another after the backward: time the
    step spends, not the model's FLOPs (a DDP rank read MFU 72% beside its peer's 2.9% for the same model, #56)."""
    torch.manual_seed(0)
    dims, batch = [32, 64, 48, 16], 8
    driven = Driven(linear_stack(dims))
    probe = torch.randn(96, 96)
    loss = driven.model(torch.randn(batch, dims[0])).pow(2).mean()
    torch.tanh(probe @ probe)  # between the passes
    loss.backward()
    torch.tanh(probe @ probe)  # after the backward, before the optimizer
    driven.counter.end()
    driven.optimizer.step()
    assert driven.counter.take_step() == (linear_hand_count(batch, dims), True)


def test_an_input_that_needs_its_gradient_is_three_forwards() -> None:
    torch.manual_seed(0)
    dims, batch = [24, 40, 8], 4
    driven = Driven(linear_stack(dims))
    got, _ = driven.step(torch.randn(batch, dims[0], requires_grad=True))
    assert got == linear_hand_count(batch, dims, input_needs_grad=True)
    assert got == 3 * sum(2 * batch * a * b for a, b in itertools.pairwise(dims))


def test_a_convolution_net_is_counted_exactly_as_by_hand() -> None:
    torch.manual_seed(0)
    batch, size = 2, 16
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 8 * 8, 10),
    )

    def conv(c_in: int, c_out: int, out: int, k: int = 3) -> int:  # 2*B*Cout*Hout*Wout*Cin*k*k
        return 2 * batch * c_out * out * out * c_in * k * k

    first, second, head = conv(3, 8, size), conv(8, 16, size // 2), 2 * batch * 16 * 8 * 8 * 10
    hand = (first + second + head) + (first + second + head) + (second + head)  # no input gradient for the first
    driven = Driven(model)
    got, _ = driven.step(torch.randn(batch, 3, size, size))
    assert got == hand
    # float32 convolutions apart: TF32 speeds them under cuDNN's flag, not the matmuls'.
    mix = driven.counter.mix()
    assert set(mix) == {"float32.conv", "float32"}
    assert mix["float32"] == pytest.approx(3 * head / hand)


def test_a_transformer_block_is_its_matmuls_by_hand_plus_the_fused_backward_recomputing_the_scores() -> None:
    torch.manual_seed(0)
    batch, tokens, d, heads, ff = 2, 16, 32, 4, 64
    model = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True)
    n = batch * tokens
    projections = 2 * n * (3 * d * d + d * d)  # the Q/K/V in-projection and the out-projection
    mlp = 2 * n * (d * ff + ff * d)
    attention = 2 * (2 * batch * tokens * tokens * d)  # scores Q.K^T and the weighted sum P.V, all heads
    forward = projections + mlp + attention
    backward = (projections + mlp) + (2 * n * d * d + mlp) + 2 * attention  # no input gradient for the in-proj
    hand = forward + backward
    driven = Driven(model)
    got, _ = driven.step(torch.randn(batch, tokens, d))
    assert got is not None
    # A fused attention kernel's backward recomputes the scores (one more Q.K^T); the math path does not.
    recompute = 2 * batch * tokens * tokens * d
    assert got - hand in (0, recompute)
    assert driven.counter.count()[1] == ""


def test_the_count_is_torchs_own_where_torch_has_formulas() -> None:
    """gputop's matmul formulas are the fast path, not different arithmetic: FlopCounterMode agrees."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    x = torch.randn(3, 3, 8, 8)
    with FlopCounterMode(display=False) as reference:
        model(x).float().pow(2).mean().backward()
    model.zero_grad(set_to_none=True)
    got, _ = Driven(model).step(x)
    assert got == reference.get_total_flops()
    batched = torch.randn(4, 5, 6), torch.randn(4, 6, 7)
    with FlopCounterMode(display=False) as reference:
        torch.bmm(*batched)
        torch.baddbmm(torch.zeros(4, 5, 7), *batched)
    mode = flop_mode.counting_mode_class()()
    with mode:
        torch.bmm(*batched)
        torch.baddbmm(torch.zeros(4, 5, 7), *batched)
    assert mode.segment.flops == reference.get_total_flops() == 2 * (2 * 4 * 5 * 6 * 7)


def test_gradient_accumulation_is_the_sum_of_its_micro_batches() -> None:
    torch.manual_seed(0)
    dims, batch = [16, 32, 8], 4
    driven = Driven(linear_stack(dims))
    one = linear_hand_count(batch, dims)
    got, counted = driven.step(*(torch.randn(batch, 16) for _ in range(4)))
    assert (got, counted) == (4 * one, True)
    # Each micro-batch was one segment, stored by its shape: a later step of 3 micro-batches is known at once.
    assert driven.step(*(torch.randn(batch, 16) for _ in range(3))) == (3 * one, False)


def test_micro_batches_of_different_shapes_are_each_counted_once_and_summed() -> None:
    torch.manual_seed(0)
    dims = [16, 32, 8]
    driven = Driven(linear_stack(dims))
    got, _ = driven.step(torch.randn(4, 16), torch.randn(6, 16))
    assert got == linear_hand_count(4, dims) + linear_hand_count(6, dims)
    assert driven.counter.shapes_counted == 2
    # Later, a step that mixes the counted shapes in another order, none counted again.
    assert driven.step(torch.randn(6, 16), torch.randn(6, 16), torch.randn(4, 16)) == (
        2 * linear_hand_count(6, dims) + linear_hand_count(4, dims),
        False,
    )


def test_a_second_step_of_the_same_shape_is_not_counted_again() -> None:
    torch.manual_seed(0)
    dims = [16, 32, 8]
    driven = Driven(linear_stack(dims))
    first = driven.step(torch.randn(4, 16))
    driven.counting_seen.clear()
    second = driven.step(torch.randn(4, 16))
    assert first == (linear_hand_count(4, dims), True)
    assert second == (first[0], False)
    assert driven.counting_seen == [False]  # no dispatch mode during the second step's forward
    assert driven.counter.shapes_counted == 1


def test_a_new_shape_is_counted_and_a_step_mark_leaves_no_mode_behind() -> None:
    torch.manual_seed(0)
    dims = [16, 32, 8]
    driven = Driven(linear_stack(dims))
    driven.step(torch.randn(4, 16))
    got, counted = driven.step(torch.randn(10, 16))
    assert (got, counted) == (linear_hand_count(10, dims), True)
    assert driven.counting_seen == [True, True]
    assert _get_current_dispatch_mode() is None
    assert torch._C._len_torch_dispatch_stack() == 0


def test_shapes_past_the_bound_are_not_counted_and_say_so() -> None:
    torch.manual_seed(0)
    dims = [8, 16, 4]
    driven = Driven(linear_stack(dims), FlopCounter(max_shapes=2))
    assert driven.step(torch.randn(1, 8))[1]
    assert driven.step(torch.randn(2, 8))[1]
    assert driven.step(torch.randn(3, 8)) == (None, False)
    figure, why = driven.counter.count()
    assert figure is None
    assert why == "more than 2 input shapes: this one was not counted"
    assert driven.step(torch.randn(2, 8)) == (linear_hand_count(2, dims), False)  # counted shapes still known


def test_forwards_before_their_backwards_are_counted_as_the_whole_step() -> None:
    """Two forwards, then one backward of both losses: the micro-batches cannot be told apart, the step can."""
    torch.manual_seed(0)
    dims = [16, 32, 8]
    model = linear_stack(dims)
    driven = Driven(model)

    def step() -> tuple[int | None, bool]:
        loss = model(torch.randn(4, 16)).pow(2).mean() + model(torch.randn(4, 16)).pow(2).mean()
        loss.backward()
        driven.counter.end()
        driven.optimizer.step()
        driven.optimizer.zero_grad(set_to_none=True)
        return driven.counter.take_step()

    expected = 2 * linear_hand_count(4, dims)
    assert step() == (expected, True)
    assert step() == (expected, False)


def test_the_optimizers_closure_runs_the_step_inside_it() -> None:
    """Lightning's forward and backward inside optimizer.step(closure): the pre-hook comes before them, the
    step mark after; the count is the same."""
    torch.manual_seed(0)
    dims = [16, 32, 8]
    model = linear_stack(dims)
    driven = Driven(model)
    x = torch.randn(4, 16)

    def closure() -> Any:
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    for expected_counted in (True, False):
        driven.counter.end()  # the optimizer's pre-hook
        driven.optimizer.step(closure)
        assert driven.counter.take_step() == (linear_hand_count(4, dims), expected_counted)
        driven.optimizer.zero_grad(set_to_none=True)


def test_before_any_step_the_figure_says_not_counted_yet() -> None:
    counter = FlopCounter()
    assert counter.count() == (None, NOT_YET)
    assert counter.take_step() == (None, False)  # a step with no forward: nothing, and no error
    assert counter.count() == (None, NOT_YET)
    assert counter.mix() == {}


# -- what cannot be counted -----------------------------------------------------------------------------------


def _custom_matmul() -> Any:
    if not hasattr(torch.library, "custom_op"):
        pytest.skip("torch.library.custom_op needs torch 2.4")
    found = getattr(torch.ops.gputoptest, "matmul", None) if hasattr(torch.ops, "gputoptest") else None
    if found is not None:
        return found

    @torch.library.custom_op("gputoptest::matmul", mutates_args=())
    def matmul(a: Tensor, b: Tensor) -> Tensor:
        return a @ b

    @matmul.register_fake
    def _(a: Tensor, b: Tensor) -> Tensor:
        return a.new_empty(a.shape[0], b.shape[1])

    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor]:
        a, b = ctx.saved_tensors
        return matmul(grad, b.t()), matmul(a.t(), grad)

    def setup(ctx: Any, inputs: Any, output: Any) -> None:
        ctx.save_for_backward(*inputs)

    matmul.register_autograd(backward, setup_context=setup)
    return torch.ops.gputoptest.matmul


class CustomLayer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width, width))
        self.op = _custom_matmul()

    def forward(self, x: Tensor) -> Tensor:
        return self.op(x, self.weight)


def test_a_model_of_operators_no_formula_knows_is_na_and_names_them() -> None:
    driven = Driven(CustomLayer(8))
    assert driven.step(torch.randn(4, 8)) == (None, True)
    assert driven.counter.count() == (None, "its operators are not countable: gputoptest.matmul")


def test_uncountable_operators_beside_countable_ones_make_a_lower_bound() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), CustomLayer(8))
    driven = Driven(model)
    got, _ = driven.step(torch.randn(4, 8))
    assert got == 2 * (2 * 4 * 8 * 8)  # the Linear's forward and weight gradient (its input needs none)
    assert driven.counter.count()[1] == "lower bound: not counted: gputoptest.matmul"


def test_only_elementwise_work_is_na_not_zero() -> None:
    class Scale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(8))

        def forward(self, x: Tensor) -> Tensor:
            return (x * self.weight).relu()

    driven = Driven(Scale())
    assert driven.step(torch.randn(4, 8)) == (None, True)
    assert driven.counter.count() == (None, flops.NO_WORK)


def test_clipping_the_gradients_norm_is_no_uncounted_matrix_work() -> None:
    """clip_grad_norm_ between the backward and the step (minGPT, the FSDP2 example) runs linalg_vector_norm: a
    reduction, not a matmul whose FLOPs went uncounted, so the figure is exact, not a lower bound."""
    torch.manual_seed(0)
    dims = [16, 32, 8]
    model = linear_stack(dims)
    counter = FlopCounter()
    counter.on_forward(shape_key((torch.randn(4, 16),), {}))
    model(torch.randn(4, 16)).pow(2).mean().backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    counter.end()
    assert counter.take_step() == (linear_hand_count(4, dims), True)
    assert counter.count() == (linear_hand_count(4, dims), "")


def test_a_tensor_subclass_runs_its_own_operators_and_they_are_counted() -> None:
    """DTensor-like subclasses: the mode lets the subclass run, and counts what it runs on plain tensors (a rank's
    own shard).  TwoTensor computes every operator on both of its halves: two matmuls."""
    two_tensor = pytest.importorskip("torch.testing._internal.two_tensor")
    a = two_tensor.TwoTensor(torch.randn(4, 5), torch.randn(4, 5))
    b = two_tensor.TwoTensor(torch.randn(5, 3), torch.randn(5, 3))
    mode = flop_mode.counting_mode_class()()
    with mode:
        torch.mm(a, b)
    assert mode.segment.flops == 2 * (2 * 4 * 5 * 3)


def test_a_dtensor_optimizer_step_under_the_counting_runs_and_counts_the_local_shard(tmp_path: Any) -> None:
    """DTensor's sharding propagation runs operators on fake tensors, which refuse a mode they do not know: the
    mode runs them off its stack.  An optimizer step on sharded parameters inside a counting (Lightning's FSDP2
    closure runs the step there) once raised "Sharding propagation failed" into training."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    store = dist.FileStore(str(tmp_path / "store"), 1)  # type: ignore[attr-defined, unused-ignore]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        param = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])
        grad = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])
        weight = distribute_tensor(torch.randn(4, 3), mesh, [Shard(0)])
        mode = flop_mode.counting_mode_class()()
        with mode:
            param.add_(grad, alpha=-0.1)
            torch.mm(param, weight)
        assert not mode.failure
        assert mode.segment.flops == 2 * 8 * 4 * 3
    finally:
        dist.destroy_process_group()


# -- failures never reach training ----------------------------------------------------------------------------


def test_a_formula_that_raises_fails_the_counting_not_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> int:
        raise ValueError("no shapes for you")

    table = dict(flop_formulas.formula_table())
    table[torch.ops.aten.addmm] = (broken, True)
    monkeypatch.setattr(flop_formulas, "formula_table", lambda: table)
    monkeypatch.setattr(flop_formulas, "PLANS", {})
    torch.manual_seed(0)
    driven = Driven(linear_stack([8, 16, 4]))
    before = [p.detach().clone() for p in driven.model.parameters()]
    assert driven.step(torch.randn(2, 8)) == (None, True)  # the step ran: its figure is N/A
    assert all(not torch.equal(p, q) for p, q in zip(driven.model.parameters(), before, strict=True))
    assert driven.counter.count() == (None, "counting failed: ValueError: no shapes for you")
    assert _get_current_dispatch_mode() is None
    assert driven.step(torch.randn(2, 8)) == (None, False)  # that shape is not tried again


class OffsetsOnTheGpu:
    """Varlen attention's ``cu_seqlens`` on a GPU: turning them into lengths (``.tolist()``) waits for the device."""

    device = torch.device("cuda", 0)

    def is_floating_point(self) -> bool:
        return False

    def tolist(self) -> list[int]:
        raise AssertionError("the training thread waited for the GPU")


def test_varlen_attentions_lengths_on_a_gpu_are_never_read_and_its_flops_say_why_they_are_not_counted() -> None:
    def flash_attention_forward_flop(*args: Any, out_val: Any = None, **kwargs: Any) -> int:  # torch's, get_raw
        return sum(kwargs["cum_seq_q"].tolist())

    func = torch.ops.aten._flash_attention_forward.default
    plans = {func: (flop_mode._COUNT, (flash_attention_forward_flop, False), "flash")}
    mode = types.SimpleNamespace(plans=plans, segment=flop_mode.Segment(None), uncounted={}, ops=0, inert=False,
                                 failure="", beside=False)  # fmt: skip
    query = torch.empty(8, 2, 4, device="meta")
    flop_mode._count(mode, func, (query, query, query), {"cum_seq_q": OffsetsOnTheGpu()}, query, lambda: -1)
    assert (mode.inert, mode.failure, mode.segment.flops) == (False, "", 0)
    assert mode.uncounted == {flop_mode.VARLEN: 1}


def test_another_dispatch_mode_already_active_is_left_alone() -> None:
    driven = Driven(linear_stack([8, 16, 4]))
    with FlopCounterMode(display=False) as theirs:
        got, counted = driven.step(torch.randn(2, 8))
        assert _get_current_dispatch_mode() is theirs.mode
    assert (got, counted) == (None, False)
    assert driven.counter.count() == (None, "another dispatch mode is active (_FlopCounterMode): not counted")
    assert theirs.get_total_flops() == linear_hand_count(2, [8, 16, 4])  # theirs counted, undisturbed
    assert driven.step(torch.randn(2, 8))[1]  # and once it is gone, the shape is counted


def test_a_mode_entered_during_the_counting_and_left_open_is_never_popped_in_its_place() -> None:
    torch.manual_seed(0)
    dims = [8, 16, 4]
    driven = Driven(linear_stack(dims))
    driven.model(torch.randn(2, 8)).pow(2).mean().backward()  # the counting began at this forward
    theirs = FlopCounterMode(display=False)
    theirs.__enter__()
    try:
        assert driven.counter.take_step() == (linear_hand_count(2, dims), True)
        assert _get_current_dispatch_mode() is theirs.mode  # ours is under theirs: left there, inert
    finally:
        theirs.__exit__(None, None, None)
    assert _get_current_dispatch_mode() is not None  # ours, until the next step mark
    driven.counter.take_step()
    assert _get_current_dispatch_mode() is None


def test_inside_a_compiled_frame_nothing_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """model.compile(): the hooks run inside the compiled frame, whose exit restores the dispatch keys: a counting
    begun there would see the forward only (docs/mfu.md measured it), so none begins."""
    monkeypatch.setattr(flop_mode, "_in_compiled_frame", lambda torch: True)
    driven = Driven(linear_stack([8, 16, 4]))
    assert driven.step(torch.randn(2, 8)) == (None, False)
    assert driven.counter.count()[1].startswith("the watched model runs compiled as a whole (model.compile())")
    assert _get_current_dispatch_mode() is None


def test_a_counting_the_dispatcher_stopped_routing_to_is_na_not_a_forward_only_figure() -> None:
    python_key = torch._C.DispatchKey.Python
    model = linear_stack([8, 16, 4])
    driven = Driven(model)
    loss = model(torch.randn(2, 8)).pow(2).mean()
    assert torch._C._dispatch_tls_is_dispatch_key_included(python_key)  # the counting is on
    # What a compiled frame's exit does: it restores the dispatch keys it found on entry, before the mode's.
    torch._C._dispatch_tls_set_dispatch_key_included(python_key, False)
    torch._C._dispatch_tls_set_dispatch_key_included(torch._C.DispatchKey.PythonTLSSnapshot, False)
    loss.backward()
    assert driven.counter.take_step() == (None, True)
    assert driven.counter.count()[1] == (
        "counting failed: the dispatcher stopped routing operators to it (a compiled frame's exit): not counted"
    )
    assert _get_current_dispatch_mode() is None


def test_a_counting_with_no_step_end_is_abandoned() -> None:
    torch.manual_seed(0)
    model = linear_stack([8, 16, 4])
    driven = Driven(model, FlopCounter(max_forwards=3))
    for _ in range(5):  # a loop with no optimizer step and no gputop.step()
        model(torch.randn(2, 8)).sum().backward()
    assert not driven.counter.counting
    assert _get_current_dispatch_mode() is None
    assert driven.counter.take_step() == (None, True)
    assert driven.counter.count()[1].startswith("no step end after 3 training forwards: counting abandoned")


def test_a_step_marked_on_another_thread_does_not_pop_this_threads_mode() -> None:
    driven = Driven(linear_stack([8, 16, 4]))
    driven.model(torch.randn(2, 8)).sum().backward()
    assert driven.counter.counting
    other = threading.Thread(target=driven.counter.end)
    other.start()
    other.join()
    assert driven.counter.counting  # only the training thread can leave its mode
    assert driven.counter.take_step()[1]
    assert _get_current_dispatch_mode() is None


def test_shape_key_never_raises_and_tells_shapes_apart() -> None:
    x, mask = torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool)
    assert shape_key((x,), {}) == ((2, 3),)
    assert shape_key((), {"input_ids": x, "attention_mask": mask}) == (
        ("input_ids", (2, 3)),
        ("attention_mask", (2, 3)),
    )
    assert shape_key(([x, x],), {}) == ((2, 3), (2, 3))
    assert shape_key((x,), {}) != shape_key((torch.zeros(3, 3),), {})
    assert shape_key((1, "text", None), {"flag": True}) == ()

    class Broken:
        @property
        def shape(self) -> Any:
            raise RuntimeError("no")

    assert shape_key((Broken(),), {}) == ("?",)
    assert len(shape_key(tuple(torch.zeros(i + 1) for i in range(20)), {})) == flops.MAX_KEY_TENSORS


def test_tf32_modes_follow_torchs_settings() -> None:
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert tf32_modes()[0] is True
        torch.set_float32_matmul_precision("highest")
        assert tf32_modes()[0] is False
    finally:
        torch.set_float32_matmul_precision(before)
    assert isinstance(tf32_modes()[1], bool)


def test_the_tf32_facts_follow_torchs_new_api_whose_old_flags_then_raise() -> None:
    from gputop.reporter.facts import torch_facts

    matmul = torch.backends.cuda.matmul
    before = getattr(matmul, "fp32_precision", None)
    if before is None:
        pytest.skip("this torch has no fp32_precision (before 2.9)")
    try:
        matmul.fp32_precision = "tf32"
        with pytest.raises(RuntimeError):
            _ = matmul.allow_tf32  # torch's own: the legacy flag refuses once the new API is used
        assert torch_facts()["tf32_matmul"] is True
        matmul.fp32_precision = "ieee"
        assert torch_facts()["tf32_matmul"] is False
    finally:
        matmul.fp32_precision = before


def test_the_cpus_peak_is_measured_within_its_budget() -> None:
    peak, cost, why = measure_cpu_peak(size=128, budget_s=0.05)
    assert why == ""
    # No lower bound worth asserting: with its cores shared (a parallel test run) a CPU read 67 MFLOP/s here.
    assert peak is not None and 0 < peak < 1e14  # less than 100 TFLOP/s: no CPU does more
    assert 0.05 <= cost < 2.0  # the budget, and at most the batch that crossed it
    assert measure_cpu_peak(dtype="no_such_dtype")[0] is None


# -- where the reporter's hooks bound a counting ----------------------------------------------------------------


class Recording(Optimizer):
    """Plain gradient descent that records the dispatch mode its update runs under, after the closure returned."""

    modes_in_update: ClassVar[list[object]] = []

    def __init__(self, params: Any, lr: float) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.modes_in_update.append(_get_current_dispatch_mode())
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    param.add_(param.grad, alpha=-group["lr"])
        return loss


@pytest.mark.parametrize("with_closure", [True, False])
def test_a_counting_is_over_before_the_optimizers_update_runs(with_closure: bool) -> None:
    """The counted step is the forward and the backward; the optimizer's update runs as it always does (Lightning's
    FSDP2 steps sharded parameters there), with or without a closure, and the step's count is the hand count."""
    from gputop.address import Address
    from gputop.reporter.reporter import Reporter

    torch.manual_seed(0)
    dims = [16, 32, 8]
    model = linear_stack(dims)
    optimizer = Recording(model.parameters(), lr=1e-3)
    Recording.modes_in_update = []
    reporter = Reporter(Address(port=1), window_s=0.5)  # not started: its hooks run as torch calls them
    try:
        reporter._install_step_hook()  # what start() does first, without the thread
        reporter.attach_model(model)
        x = torch.randn(4, 16)

        def closure() -> Tensor:
            loss = model(x).pow(2).mean()
            loss.backward()
            return loss

        for _ in range(2):
            if with_closure:
                optimizer.step(closure)
            else:
                closure()
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        assert Recording.modes_in_update == [None, None]
        assert list(reporter.side.step_work) == [
            (linear_hand_count(4, dims), True),
            (linear_hand_count(4, dims), False),
        ]
    finally:
        reporter.shutdown()
        reporter.thread.sender.close()
