"""The dispatch mode that counts FLOPs: every aten operator passes through it, runs first and as it is, and adds
the FLOPs its formula (``flop_formulas.py``) gives; and when such a mode may be entered and left.

A ``FlopCounter`` (``flops.py``) enters one at a training forward's pre-hook and leaves it at the step's end;
the mode adds each operator's FLOPs to the open ``Segment`` (one micro-batch's forward and backward), names the
operators that did matrix work no formula knows, and turns itself inert (it only passes operators on) when
something goes wrong or a step runs past ``MAX_OPS`` operators.  Every operator runs before the mode looks at
it: a counting never changes what runs.  The autograd engine's device threads inherit the mode, so a backward
is counted where it runs.  This module imports torch only inside functions.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable, Hashable
from typing import Any

from gputop.reporter import flop_formulas
from gputop.reporter.flop_formulas import shape_kwargs, shape_of, shapes

MAX_OPS = 1_000_000  # operators in one counting: past it the mode stops counting (it only passes them on)

# aten operators that do matrix work but have no formula (in torch's table or EXTRA_FORMULAS): a count without
# them is a lower bound, and a count of nothing but them is N/A.  Matched on the operator's name; the exclusions
# are names that only look alike (interpolation, a kernel choice, a dtype conversion).
_MATRIX_WORK = re.compile(
    r"mm|conv|attention|_sdp|rnn|lstm|gru|linalg|cholesky|triangular|svd|fft|^mv$|addmv|^dot$|vdot|^addr$|"
    r"^ger$|einsum|tensordot|matmul|linear|cdist|euclidean"
)
_NOT_MATRIX_WORK = re.compile(r"upsample|grid_sampler|_fused_sdp_choice|convert|_to_copy|^mm_dtype|norm")
# Namespaces whose operators move or describe data, never compute on it (communication, profiling, FSDP's
# copies, inductor's buffer bookkeeping); any other namespace but aten's is a library's own kernel (flash_attn,
# xformers, torchao, mkldnn's fused linear, a script's custom op) whose FLOPs no formula knows.
_NO_WORK_NAMESPACES = frozenset(
    {
        "c10d",
        "_c10d_functional",
        "_c10d_functional_autograd",
        "_dtensor",
        "profiler",
        "fsdp",
        "prims",
        "prim",
        "debugprims",
        "inductor",
        "_inductor",
        "aten",
    }
)

# What the dispatch mode does with an operator after running it, decided once per operator (``_plan``):
# nothing, count its FLOPs, or name it as work no formula counts.
_PASS, _COUNT, _WORK = 0, 1, 2


# The name varlen attention's operators go uncounted under (``_lengths_on_a_device``).
VARLEN = "varlen attention (its sequence lengths are on the GPU: reading them would wait for it)"


def reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


class Segment:
    """One micro-batch's part of a counting: from a training forward's pre-hook to the next, or to the step end."""

    __slots__ = ("backward_ops", "by_dtype", "flops", "forward_ops", "key")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.flops = 0
        self.by_dtype: dict[str, int] = {}
        self.forward_ops = 0  # operators dispatched outside autograd's engine
        self.backward_ops = 0  # and inside it (a backward)


# -- entering and leaving -------------------------------------------------------------------------------------


def why_not_count() -> str:
    """Why a counting must not start now ("" when it may)."""
    torch: Any = sys.modules.get("torch")
    if torch is None:
        return "torch is not imported"
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

    current = _get_current_dispatch_mode()
    if current is not None:
        # Stacked under a mode the script entered first, its exit could pop ours: only count on an empty stack.
        return f"another dispatch mode is active ({type(current).__name__}): not counted"
    if _in_compiled_frame(torch):
        # The hook runs inside a frame dynamo compiled (``model.compile()``, or hooks on the module inside
        # ``torch.compile(model)``): on the frame's exit dynamo restores the dispatch keys it found on entry, and
        # the mode would see the forward and never the backward.
        return (
            "the watched model runs compiled as a whole (model.compile()): its hooks run inside the compiled "
            "frame, where a counting misses the backward; not counted (watching torch.compile(model)'s wrapper "
            "counts)"
        )
    if not hasattr(TorchDispatchMode, "ignore_compile_internals") and compiled_anything():
        # Older torch runs compiled code eagerly under any dispatch mode (more memory, fullgraph errors).
        return "torch.compile is in use and this torch would run it eagerly under counting: not counted"
    return ""


def _in_compiled_frame(torch: Any) -> bool:
    """Whether this code runs inside a frame dynamo manages (its eval-frame callback is set)."""
    try:
        return torch._C._dynamo.eval_frame.get_eval_frame_callback() is not None
    except Exception:
        return False


def dispatch_on() -> bool:
    """Whether this thread's dispatcher still routes operators to the dispatch modes on its stack."""
    import torch

    return bool(torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.Python))


def compiled_anything() -> bool:
    """Whether dynamo has compiled a frame in this process (read from its own record; never imports it)."""
    utils: Any = sys.modules.get("torch._dynamo.utils")
    try:
        return bool(utils is not None and getattr(utils, "_compilation_metrics", None))
    except Exception:
        return False


def pop_if_top(mode: Any) -> bool:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    leave = mode.__exit__
    if _get_current_dispatch_mode() is not mode:
        return False
    leave(None, None, None)
    return True


# -- the mode ------------------------------------------------------------------------------------------------

_MODE_CLASS: Any = None


def counting_mode_class() -> Any:
    """The ``TorchDispatchMode`` that counts, built once on first use (``type()``: this module imports torch
    only here, and mypy checks it where torch is absent too)."""
    global _MODE_CLASS
    if _MODE_CLASS is None:
        _MODE_CLASS = _build_mode_class()
    return _MODE_CLASS


def _build_mode_class() -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    graph_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: 0)
    disabled = torch._C._disabled_torch_dispatch_impl
    no_data = _dataless_tensor_classes()

    def init(self: Any) -> None:
        TorchDispatchMode.__init__(self)
        _start(self)

    def dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if kwargs is None:
            kwargs = {}
        if types:
            subclass = _subclass_kind(types, disabled, no_data)
            if subclass == 2:
                # Shapes without data: DTensor's sharding propagation, a tracer.  No work, and the subclass
                # refuses a mode it does not know on the stack, so it runs here, where this mode is off it.
                return func(*args, **kwargs)
            if subclass:
                # A tensor subclass (DTensor, a float8 or nested tensor): let it run its operators, which come
                # back here on plain tensors, so a rank counts its own shard's work.
                return NotImplemented
        out = func(*args, **kwargs)  # first, and as it is: a counting never changes what runs
        if not self.inert:
            _count(self, func, args, kwargs, out, graph_task_id)
        return out

    attributes: dict[str, Any] = {
        "__init__": init,
        "__torch_dispatch__": dispatch,
        "supports_higher_order_operators": True,
        # Compiled code runs compiled under the mode (never eagerly: that changes its memory, and raises where
        # a function was compiled with fullgraph=True); the mode sees the kernels it calls through the
        # dispatcher (cuBLAS matmuls, attention) but not generated ones: the figure is then a lower bound.
        "ignore_compile_internals": classmethod(lambda cls: True),
    }
    return type("_FlopCountingMode", (TorchDispatchMode,), attributes)


def _start(mode: Any) -> None:
    """A new mode's own state, after ``TorchDispatchMode``'s."""
    mode.registry = flop_formulas.formula_table()
    mode.plans = flop_formulas.PLANS.setdefault(id(mode.registry), {})  # decided once per operator and table
    mode.segment = Segment(None)
    mode.inert = False  # passes operators on, counts nothing
    # Between a training forward's end and the next forward, outside any backward: work beside the model (the
    # user's metric between the passes, after the backward), which is time, not the model's FLOPs.
    mode.beside = False
    mode.failure = ""
    mode.ops = 0
    mode.uncounted = {}


def _subclass_kind(types: Any, disabled: Any, no_data: tuple[type, ...]) -> int:
    """Whether an operand is a tensor subclass with a ``__torch_dispatch__`` of its own (``types`` may also
    hold ``torch.Tensor`` itself, whose is ``disabled``): 0 none, 1 one that computes on tensors it holds,
    2 one that stands for no data (a fake or functional tensor)."""
    found = 0
    for kind in types:
        if getattr(kind, "__torch_dispatch__", disabled) is not disabled:
            if issubclass(kind, no_data):
                return 2
            found = 1
    return found


def _count(mode: Any, func: Any, args: Any, kwargs: Any, out: Any, graph_task_id: Callable[[], int]) -> None:
    """What an operator that ran adds to the open segment: its FLOPs, or its name as uncounted work.  A failure
    turns the mode inert and says why; nothing raises out of here."""
    try:
        found = mode.plans.get(func)
        if found is None:
            found = _plan(mode, func)
        kind = found[0]
        segment = mode.segment
        if graph_task_id() == -1:
            if mode.beside:
                return
            segment.forward_ops += 1
        else:
            segment.backward_ops += 1
        if kind == _COUNT:
            formula, by_shape = found[1]
            if by_shape:
                flops = int(formula(*shapes(args), out_shape=shape_of(out), **shape_kwargs(kwargs)))
            elif _lengths_on_a_device(args, kwargs):  # varlen attention: its formula would read them (a sync)
                mode.uncounted[VARLEN] = mode.uncounted.get(VARLEN, 0) + 1
                mode.ops += 1
                return
            else:  # a formula torch registered raw (get_raw): tensors in, as FlopCounterMode calls it
                flops = int(formula(*args, **kwargs, out_val=out))
            segment.flops += flops
            dtype = _dtype_of(args, found[2])
            segment.by_dtype[dtype] = segment.by_dtype.get(dtype, 0) + flops
        elif kind == _WORK:
            mode.uncounted[found[2]] = mode.uncounted.get(found[2], 0) + 1
        mode.ops += 1
        if mode.ops > MAX_OPS:
            mode.inert = True
            mode.failure = f"more than {MAX_OPS} operators in one step"
    except Exception as exc:
        mode.inert = True
        mode.failure = reason(exc)


def _lengths_on_a_device(args: Any, kwargs: Any) -> bool:
    """Whether an operator takes an integer tensor off the host: varlen attention's sequence offsets
    (``cu_seqlens_q``, ``cum_seq_k``), whose formula turns them into lengths with ``.tolist()``, which on a GPU
    waits for the device: never on the training thread.  Its FLOPs go uncounted, and the note says why."""
    for value in (*args, *kwargs.values()):
        device = getattr(value, "device", None)
        if device is not None and device.type not in ("cpu", "meta") and not value.is_floating_point():
            return True
    return False


def _plan(mode: Any, func: Any) -> tuple[int, Any, str]:
    """What the mode does with an operator after running it, decided once per operator and table."""
    from torch._ops import HigherOrderOperator

    if isinstance(func, HigherOrderOperator):
        formula = mode.registry.get(func)
        name = f"higher_order.{getattr(func, '_name', func)}"
        found = (_COUNT, formula, name) if formula is not None else (_WORK, None, name)
    else:
        packet = func._overloadpacket
        formula = mode.registry.get(packet)
        name = str(packet)
        if formula is not None:
            found = (_COUNT, formula, name)
        elif _does_work(func.namespace, func._opname):
            found = (_WORK, None, name)
        else:
            found = (_PASS, None, name)
    mode.plans[func] = found
    return found


def _dataless_tensor_classes() -> tuple[type, ...]:
    """The tensor subclasses that stand for shapes without data (fake and functional tensors)."""
    import importlib

    found: list[type] = []
    for module, name in (
        ("torch._subclasses.fake_tensor", "FakeTensor"),
        ("torch._subclasses.functional_tensor", "FunctionalTensor"),
    ):
        with contextlib.suppress(Exception):  # a torch without it: nothing of that kind reaches the mode
            found.append(getattr(importlib.import_module(module), name))
    return tuple(found)


def _does_work(namespace: str, name: str) -> bool:
    """Whether an operator without a formula does matrix work (its FLOPs then go uncounted)."""
    if namespace not in _NO_WORK_NAMESPACES:
        return True  # a library's own kernel: what it computes, no formula knows
    return namespace == "aten" and bool(_MATRIX_WORK.search(name)) and not _NOT_MATRIX_WORK.search(name)


def _dtype_of(args: Any, name: str) -> str:
    """The dtype a counted operator computed in: its first tensor argument's; float32 convolutions apart."""
    for arg in args[:3]:
        dtype = getattr(arg, "dtype", None)
        if dtype is not None:
            text = str(dtype).rpartition(".")[2]
            return f"{text}.conv" if text == "float32" and "conv" in name else text
    return "unknown"
