"""What counting a step's FLOPs costs the training thread, how exact the count is, and the CPU's measured peak.

For three small models on the CPU (a stack of Linear layers, a small convolution net, one
``nn.TransformerEncoderLayer``):

- the count (``gputop.reporter.flops.FlopCounter``, driven as the reporter's hooks drive it) against a
  count by hand of the same matrix work, and what ``torch.utils.flop_counter.FlopCounterMode`` gives;
- what no formula counts: the output elements of every other operator (elementwise, softmax, layer norm,
  reductions), each worth roughly 1-5 FLOPs, as a share of the counted FLOPs;
- the counted step's time as a multiple of a steady step's (median of ROUNDS fresh counters, each
  against the median of STEADY plain steps), and what one ``shape_key`` + ``on_forward`` + ``take_step``
  costs a step that is not counted;
- ``measure_cpu_peak()``: the FLOP/s and what the measurement itself cost.

Run: .venv/bin/python benchmarks/flops_cost.py     (about 20 s on 2 cores)
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode
from torch.utils.flop_counter import flop_registry as torch_registry

from gputop.reporter.device_peak import measure_cpu_peak
from gputop.reporter.flop_formulas import formulas
from gputop.reporter.flops import FlopCounter, shape_key

ROUNDS, STEADY = 7, 30


def linear_stack() -> tuple[nn.Module, torch.Tensor, int]:
    batch, dims = 64, [512, 1024, 1024, 256]
    model = nn.Sequential(nn.Linear(dims[0], dims[1]), nn.GELU(), nn.Linear(dims[1], dims[2]), nn.GELU())
    model.append(nn.Linear(dims[2], dims[3]))
    layers = list(itertools.pairwise(dims))
    forward = sum(2 * batch * i * o for i, o in layers)
    # Backward: every weight's gradient (as much as its forward), every input's gradient but the first layer's
    # (the batch needs none).
    backward = forward + forward - 2 * batch * dims[0] * dims[1]
    return model, torch.randn(batch, dims[0]), forward + backward


def tiny_linear_stack() -> tuple[nn.Module, torch.Tensor, int]:
    """A step of about a hundred microseconds: the dispatch mode's cost per operator shows."""
    batch, dims = 8, [32, 64, 64, 16]
    model = nn.Sequential(nn.Linear(dims[0], dims[1]), nn.GELU(), nn.Linear(dims[1], dims[2]), nn.GELU())
    model.append(nn.Linear(dims[2], dims[3]))
    forward = sum(2 * batch * i * o for i, o in itertools.pairwise(dims))
    return model, torch.randn(batch, dims[0]), forward + forward + forward - 2 * batch * dims[0] * dims[1]


def conv_net() -> tuple[nn.Module, torch.Tensor, int]:
    batch, size = 16, 32
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * 16 * 16, 10),
    )

    def conv(c_in: int, c_out: int, out: int, k: int = 3) -> int:
        return 2 * batch * c_out * out * out * c_in * k * k

    first, second, head = conv(3, 16, 32), conv(16, 32, 16), 2 * batch * 32 * 16 * 16 * 10
    forward = first + second + head
    backward = (first + second + head) + (second + head)  # weight gradients; input gradients but the first's
    return model, torch.randn(batch, 3, size, size), forward + backward


def transformer_block() -> tuple[nn.Module, torch.Tensor, int]:
    batch, tokens, d, heads, ff = 8, 128, 256, 4, 1024
    model = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True)
    n = batch * tokens
    projections = 2 * n * (3 * d * d + d * d)  # Q, K, V in one in-projection, and the out-projection
    mlp = 2 * n * (d * ff + ff * d)
    attention = 2 * batch * tokens * tokens * d * 2  # scores Q.K^T and the weighted sum P.V, over all heads
    forward = projections + mlp + attention
    weight_grads = projections + mlp
    input_grads = 2 * n * d * d + mlp  # every layer's but the in-projection's (the batch needs none)
    backward = weight_grads + input_grads + 2 * attention  # dQ, dK from the scores; dP, dV from the sum
    return model, torch.randn(batch, tokens, d), forward + backward


class _Operators(TorchDispatchMode):
    """How many operators a step dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls += 1
        return func(*args, **(kwargs or {}))


class _LeftOut(TorchDispatchMode):
    """Output elements of the operators no formula counts (a proxy for their FLOPs: ~1-5 per element)."""

    def __init__(self, counted: set[Any]) -> None:
        super().__init__()
        self.counted = counted
        self.elements = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func._overloadpacket not in self.counted and not func.is_view:
            for item in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(item, torch.Tensor) and item.is_floating_point():
                    self.elements += item.numel()
        return out


def hooked(model: nn.Module, counter: FlopCounter) -> Callable[[torch.Tensor], None]:
    """One training step as the reporter's hooks drive the counter: pre-hook, optimizer pre-hook, step mark."""

    def pre(module: Any, args: Any, kwargs: Any) -> None:
        if torch.is_grad_enabled():
            counter.on_forward(shape_key(args, kwargs))

    model.register_forward_pre_hook(pre, with_kwargs=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step(x: torch.Tensor) -> None:
        model(x).float().pow(2).mean().backward()
        counter.end()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        counter.take_step()

    return step


def timed(step: Callable[[torch.Tensor], None], x: torch.Tensor) -> float:
    start = time.perf_counter()
    step(x)
    return time.perf_counter() - start


def measure(name: str, build: Callable[[], tuple[nn.Module, torch.Tensor, int]]) -> None:
    torch.manual_seed(0)
    model, x, hand = build()
    counter = FlopCounter()
    step = hooked(model, counter)
    step(x)
    counted = counter.count()[0] or 0
    with FlopCounterMode(display=False) as reference:
        model(x).float().pow(2).mean().backward()
    model.zero_grad(set_to_none=True)
    left_out = _LeftOut({*torch_registry, *formulas()})
    with left_out:
        model(x).float().pow(2).mean().backward()
    model.zero_grad(set_to_none=True)
    print(f"{name}: counted {counted:,}  by hand {hand:,}  error {(counted - hand) / hand:+.2%}")
    print(
        f"  FlopCounterMode {reference.get_total_flops():,} ({(reference.get_total_flops() - hand) / hand:+.2%});"
        f" other operators' output elements {left_out.elements:,} = {left_out.elements / hand:.2%} of the count"
    )
    ratios, steadies = [], []
    for _ in range(ROUNDS):
        counter = FlopCounter()
        torch.manual_seed(0)
        model, x, _ = build()
        step = hooked(model, counter)
        counter.enabled = False  # warm-up steps, not counted
        for _ in range(3):
            step(x)
        counter.enabled = True
        counted_s = timed(step, x)  # the one counted step
        steady = statistics.median(timed(step, x) for _ in range(STEADY))
        ratios.append(counted_s / steady)
        steadies.append(steady)
    operators = _Operators()
    with operators:
        step(x)
    reference_s = []
    for _ in range(STEADY // 3):  # FlopCounterMode around a whole step, for comparison
        with FlopCounterMode(display=False):
            reference_s.append(timed(step, x))
    reference_ratio = statistics.median(reference_s) / statistics.median(steadies)
    extra_s = statistics.median(ratios) * statistics.median(steadies) - statistics.median(steadies)
    quartiles = statistics.quantiles(ratios, n=4)
    print(
        f"  counted step / steady step: median {statistics.median(ratios):.2f}x "
        f"(quartiles {quartiles[0]:.2f}-{quartiles[2]:.2f}, {ROUNDS} rounds); "
        f"steady step {statistics.median(steadies) * 1e3:.2f} ms; {operators.calls} operators a step, "
        f"{extra_s / operators.calls * 1e6:.1f} µs extra each; a step under FlopCounterMode {reference_ratio:.2f}x"
    )


def hook_cost() -> None:
    """What a step that is not counted pays: a key, a lookup, the step's figure (best of 7 runs of 2,000)."""
    counter = FlopCounter()
    x = torch.randn(8, 32)
    key = shape_key((x,), {})
    counter._per_forward[key] = 1000  # as if counted
    best = float("inf")
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(2000):
            counter.on_forward(shape_key((x,), {}))
            counter.end()
            counter.take_step()
        best = min(best, (time.perf_counter() - start) / 2000)
    print(f"uncounted step's cost (shape_key + on_forward + end + take_step, one tensor): {best * 1e6:.2f} µs")


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name, build in (
        ("tiny linear stack", tiny_linear_stack),
        ("linear stack", linear_stack),
        ("conv net", conv_net),
        ("transformer block", transformer_block),
    ):
        measure(name, build)
    hook_cost()
    for _ in range(3):
        flops, cost, why = measure_cpu_peak()
        print(f"measure_cpu_peak: {flops / 1e9 if flops else float('nan'):.1f} GFLOP/s, cost {cost * 1e3:.0f} ms {why}")


if __name__ == "__main__":
    main()
