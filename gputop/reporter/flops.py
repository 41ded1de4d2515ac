"""The work a training step does: its FLOPs, counted once per input shape from the operators that ran (issue #46).

A ``FlopCounter`` is driven by the reporter's hooks on the training thread.  At a training forward's pre-hook
(``on_forward(key)``), a shape it has counted adds that micro-batch's FLOPs to the step's sum (a dict lookup
and an add); a shape it has not counted starts the counting: a ``TorchDispatchMode`` is entered there and every
aten operator that runs on this thread (and on the autograd engine's device threads, which inherit the mode)
passes through it until the optimizer's pre-hook (``end()``) or the step mark (``take_step()``) leaves it.
Each operator with a FLOP formula in ``torch.utils.flop_counter`` (matrix multiplications, convolutions and
their backward, the fused attention kernels; FlopCounterMode's own table, read again when a script registers
more), plus the few ``EXTRA_FORMULAS`` torch's table lacks (the CPU's fused attention, ``_addmm_activation``,
``addbmm``), adds its FLOPs; everything else (elementwise, softmax, normalisation, reductions, the optimizer)
counts nothing, as in every MFU figure.  Every operator runs first and as it is: a counting never changes
what runs.  Why not FlopCounterMode itself, and what torch.compile does to the count: docs/mfu.md.

What is counted is what ran: a frozen layer's weight gradient that autograd never computes is not counted, the
first layer's input gradient when the input needs none is not counted, and activation checkpointing's
recomputed forwards are (hardware FLOPs, not model FLOPs, there).  Gradient accumulation is the step's sum:
the counting splits at every training forward's pre-hook, so each micro-batch's forward and its backward are
one segment, stored under that micro-batch's shape, and a later step sums its micro-batches' entries.  Where a
step runs its forwards before their backwards (the segments do not split), the step is stored whole under the
list of its shapes instead.  A step during which counting ran is flagged (``take_step()[1]``): the dispatch
mode costs the training thread Python work per operator (docs/mfu.md: 10-40 µs each on a 2-core CPU, 1.1-1.4x
a step of a few milliseconds, ~3x one of 0.4 ms), so its time belongs out of the steady figures.

Never raises into training: every entry point catches what goes wrong, counts it and says why the figure is N/A.
Never synchronises: formulas read shapes only.  This module imports torch only inside functions (the reporter's
rule: ``import gputop`` in a training script loads no torch until a model is watched).
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

MAX_SHAPES = 16  # distinct input shapes (and whole-step shape lists) counted; new ones after that stay N/A
MAX_FORWARDS = 64  # training forwards in one counting: no step end by then and the counting is abandoned
MAX_OPS = 1_000_000  # operators in one counting: past it the mode stops counting (it only passes them on)
MAX_FAILURES = 3  # countings that failed or were abandoned: after these, no more
MAX_KEY_TENSORS = 8  # tensors whose shapes make a forward's key
NAMES_KEPT = 6  # uncountable operators named in a note

NOT_YET = "model not counted yet"
NO_WORK = "no matrix multiplication, convolution or attention ran in the counted step"

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

# What the dispatch mode does with an operator after running it, decided once per operator (``plan``):
# nothing, count its FLOPs, or name it as work no formula counts.
_PASS, _COUNT, _WORK = 0, 1, 2


def shape_key(args: Any, kwargs: Any) -> tuple[Any, ...]:
    """The key a forward's FLOPs are stored under: the shapes of its tensor arguments, positional then keyword
    (with the keyword's name), looked one level into tuples, lists and dicts, at most ``MAX_KEY_TENSORS``.

    Duck-typed (``shape``), like ``clock.input_numel``; what a forward's FLOPs depend on beyond its tensors'
    shapes (a scalar argument, the data itself: mixture-of-experts routing, early exit) is assumed the same
    as in the counted step.  Never raises: a key it cannot build is ``("?",)``, which is counted once.
    """
    try:
        key: list[Any] = []
        for value in args:
            _add_shapes(key, value, None)
        if kwargs:
            for name, value in kwargs.items():
                _add_shapes(key, value, name)
        return tuple(key)
    except Exception:
        return ("?",)


def _add_shapes(key: list[Any], value: Any, name: str | None) -> None:
    if len(key) >= MAX_KEY_TENSORS:
        return
    shape = getattr(value, "shape", None)
    if shape is not None:
        shape = shape if isinstance(shape, tuple) else tuple(shape)  # torch.Size is a tuple: hashable as it is
        key.append(shape if name is None else (name, shape))
        return
    kind = type(value)
    items = value.values() if kind is dict else value if kind is tuple or kind is list else ()
    for item in items:
        shape = getattr(item, "shape", None)
        if shape is not None and len(key) < MAX_KEY_TENSORS:
            shape = shape if isinstance(shape, tuple) else tuple(shape)
            key.append(shape if name is None else (name, shape))


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


class _Segment:
    """One micro-batch's part of a counting: from a training forward's pre-hook to the next, or to the step end."""

    __slots__ = ("backward_ops", "by_dtype", "flops", "forward_ops", "key")

    def __init__(self, key: Hashable) -> None:
        self.key = key
        self.flops = 0
        self.by_dtype: dict[str, int] = {}
        self.forward_ops = 0  # operators dispatched outside autograd's engine
        self.backward_ops = 0  # and inside it (a backward)


class FlopCounter:
    """FLOPs per training step, counted once per input shape.  Training thread: ``on_forward``, ``end``,
    ``take_step``.  Any thread: ``figure``, ``mix``, ``shapes_counted``, ``errors``.
    """

    def __init__(self, *, max_shapes: int = MAX_SHAPES, max_forwards: int = MAX_FORWARDS) -> None:
        self.max_shapes = max_shapes
        self.max_forwards = max_forwards
        self.enabled = True
        self.errors = 0  # failures swallowed (counting and bookkeeping)
        self._per_forward: dict[Hashable, int] = {}  # a micro-batch's shape -> its forward + backward FLOPs
        self._per_step: dict[tuple[Any, ...], int] = {}  # a step's shapes, in order -> its FLOPs (did not split)
        self._tried: set[Hashable] = set()  # shapes a counting began at: none is counted twice
        self._by_dtype: dict[str, int] = {}  # every counted FLOP by its operands' dtype (float32 convs apart)
        self._uncounted: dict[str, int] = {}  # operators that did work no formula counts, and how often
        self._compiled = False  # torch.compile had compiled something when a counting ended
        self._note = ""  # what every figure leaves out (a lower bound's note); "" when nothing
        self._failures = 0
        self._refused = False  # a shape came after the bound
        self._why_not = ""  # why the last counting could not run or failed
        self._why_key: dict[Hashable, str] = {}  # why a shape that was tried has no figure
        # The counting in progress: the dispatch mode, its segments (the open one last), the thread it is on.
        self._mode: Any = None
        self._segments: list[_Segment] = []
        self._thread = 0
        self._stale: list[Any] = []  # modes that could not be left yet (another mode above them)
        # This step, as the hooks saw it.
        self._step_flops = 0
        self._step_unknown = 0  # micro-batches whose shape had no entry
        self._step_keys: list[Hashable] = []
        self._step_counted = False
        self._step_why = ""  # why a micro-batch of this step has no figure
        self._figure: tuple[int | None, str] = (None, NOT_YET)  # the latest step's, for any thread

    # -- training thread ---------------------------------------------------------------------------

    def on_forward(self, key: Hashable) -> None:
        """A training forward begins (the watched model's pre-hook, autograd on): count its shape, or add what
        it was counted at."""
        try:
            if self._mode is not None:
                self._next_segment(key)
                return
            keys = self._step_keys
            if len(keys) < self.max_forwards:
                keys.append(key)
            flops = self._per_forward.get(key)
            if flops is not None:
                self._step_flops += flops
            elif key in self._tried or not self.enabled or not self._begin(key):
                self._step_unknown += 1
                if not self._step_why:
                    self._step_why = self._why_unknown(key)
        except Exception as exc:
            self._fail(exc)

    def _why_unknown(self, key: Hashable) -> str:
        """Why a micro-batch of this shape has no figure (the step's note, where the step has none)."""
        if key in self._tried:
            return self._why_key.get(key) or (
                "its forwards ran before their backwards, so each micro-batch's FLOPs could not be told apart, "
                "and this step's shapes differ from the counted step's"
            )
        if not self.enabled:
            return f"counting stopped after {self._failures} failures; the last: {self._why_not}"
        if self._refused:
            return f"more than {self.max_shapes} input shapes: this one was not counted"
        return self._why_not or NOT_YET

    def end(self) -> None:
        """The step's forwards and backwards are done (the optimizer's pre-hook): leave the counting, if one runs.
        Costs an attribute read when none does."""
        if self._mode is None:
            return
        try:
            self._stop()
        except Exception as exc:
            self._fail(exc)

    def take_step(self) -> tuple[int | None, bool]:
        """The step mark: this step's FLOPs (None: N/A, ``figure()`` says why) and whether it ran under counting
        (its time is then no steady step's).  Ends a counting still running (``gputop.step()`` without an
        optimizer hook)."""
        try:
            if self._mode is not None:
                self._stop()
            if self._stale:
                self._retry_stale()  # an inert mode left under another: pop it once that one is gone
            counted = self._step_counted
            flops: int | None = self._step_flops
            if not self._step_keys and not self._step_why:
                # No training forward of the watched model in this step: nothing to say of its work.
                self._step_why = "no training forward of the watched model in this step" if self._tried else NOT_YET
                flops = None
            elif self._step_unknown:
                flops = self._per_step.get(tuple(self._step_keys)) if self._per_step else None
            self._figure = self._describe(flops)
            if not flops:
                flops = None
            self._new_step()
            return flops, counted
        except Exception as exc:
            self._fail(exc)
            self._figure = (None, self._step_why)
            self._new_step()
            return None, False

    def _new_step(self) -> None:
        self._step_flops = self._step_unknown = 0
        self._step_keys = []
        self._step_counted = False
        self._step_why = ""

    # -- any thread ----------------------------------------------------------------------------------

    def figure(self) -> tuple[int | None, str]:
        """The latest step's FLOPs and a note: why it is N/A, or what a figure leaves out ("lower bound: ...");
        "" when it is the count of every operator that ran."""
        return self._figure

    def mix(self) -> dict[str, float]:
        """Each dtype's share of the counted FLOPs ("bfloat16", "float32", "float32.conv" for float32
        convolutions, which TF32 speeds under its own flag): what the peak to compare with is made of."""
        counts = dict(self._by_dtype)
        total = sum(counts.values())
        return {dtype: flops / total for dtype, flops in counts.items()} if total else {}

    @property
    def shapes_counted(self) -> int:
        return len(self._per_forward) + len(self._per_step)

    @property
    def counting(self) -> bool:
        return self._mode is not None

    # -- the counting -----------------------------------------------------------------------------------

    def _begin(self, key: Hashable) -> bool:
        """Enter the dispatch mode for this step, if this shape may be counted; False: not counted."""
        if len(self._tried) >= self.max_shapes:
            self._refused = True
            return False
        self._retry_stale()
        why = _why_not_count()
        if why:
            self._why_not = why
            return False
        mode = _counting_mode_class()()
        mode.__enter__()
        self._tried.add(key)
        self._mode = mode
        self._thread = threading.get_ident()
        self._segments = [_Segment(key)]
        mode.segment = self._segments[0]
        self._step_counted = True
        return True

    def _next_segment(self, key: Hashable) -> None:
        mode = self._mode
        if len(self._segments) >= self.max_forwards:
            mode.inert = True
            self._leave(mode)
            self._why_not = (
                f"no step end after {self.max_forwards} training forwards: counting abandoned "
                "(an optimizer step or gputop.step() ends a step)"
            )
            self._segments_failed(self._segments)
            self._segments = []
            self._step_unknown += 1  # this forward, which no counting sees either
            return
        segment = _Segment(key)
        self._segments.append(segment)
        mode.segment = segment
        keys = self._step_keys
        if len(keys) < self.max_forwards:
            keys.append(key)

    def _stop(self) -> None:
        mode = self._mode
        if mode is None:
            return
        if threading.get_ident() != self._thread:
            return  # the mode is on the training thread's stack: only that thread can leave it
        if not mode.failure and not _dispatch_on():
            # On the stack but no longer dispatched to: something restored the thread's dispatch keys (a
            # compiled frame's exit), so the operators since then went uncounted.
            mode.failure = "the dispatcher stopped routing operators to it (a compiled frame's exit): not counted"
        mode.inert = True
        self._leave(mode)
        segments = self._segments
        self._segments = []
        if mode.failure:
            self._why_not = f"counting failed: {mode.failure}"
            self._segments_failed(segments)
            return
        for name, calls in mode.uncounted.items():
            if name in self._uncounted or len(self._uncounted) < NAMES_KEPT:
                self._uncounted[name] = self._uncounted.get(name, 0) + calls
        self._compiled = self._compiled or _compiled_anything()
        self._update_note()
        total = 0
        for segment in segments:
            total += segment.flops
            for dtype, flops in segment.by_dtype.items():
                self._by_dtype[dtype] = self._by_dtype.get(dtype, 0) + flops
        self._step_flops += total
        # Each micro-batch's segment holds its forward and its backward where every segment ran both: then they
        # are stored by shape.  Otherwise (forwards first, one backward after) only the whole step is a figure,
        # and only if the counting began at the step's first forward.
        if all(s.forward_ops and s.backward_ops for s in segments):
            for segment in segments:
                self._per_forward.setdefault(segment.key, segment.flops)
        elif len(segments) == len(self._step_keys) and len(self._per_step) < self.max_shapes:
            self._per_step[tuple(self._step_keys)] = total
            self._step_unknown = len(self._step_keys)  # the step's figure is the whole-step entry

    def _leave(self, mode: Any) -> None:
        """Pop the mode off this thread's dispatch-mode stack, if it is on top; else keep it inert to pop later."""
        self._mode = None
        if not _pop_if_top(mode):
            self._stale.append(mode)
            self._why_not = "another dispatch mode was entered during the counting and is still active"

    def _retry_stale(self) -> None:
        while self._stale and _pop_if_top(self._stale[-1]):
            self._stale.pop()

    def _segments_failed(self, segments: list[_Segment]) -> None:
        """A counting that failed: its shapes have no figure, and say why; this step has none either."""
        for segment in segments:
            self._why_key[segment.key] = self._why_not
        self._step_unknown += len(segments)
        self._step_why = self._step_why or self._why_not
        self._count_failure()

    def _count_failure(self) -> None:
        self._failures += 1
        if self._failures >= MAX_FAILURES:
            self.enabled = False

    def _fail(self, exc: BaseException) -> None:
        self.errors += 1
        self._why_not = f"counting failed: {_reason(exc)}"
        self._step_unknown += 1
        self._step_why = self._step_why or self._why_not
        mode = self._mode
        if mode is not None:
            mode.inert = True
            try:
                self._leave(mode)
            except Exception:
                self._mode = None
        self._count_failure()

    def _describe(self, flops: int | None) -> tuple[int | None, str]:
        if flops is None:
            return None, self._step_why or NOT_YET
        if flops == 0:
            uncounted = ", ".join(sorted(self._uncounted))
            return None, f"its operators are not countable: {uncounted}" if uncounted else NO_WORK
        figure = self._figure
        return figure if figure == (flops, self._note) else (flops, self._note)

    def _update_note(self) -> None:
        """What every figure leaves out, after a counting: the uncountable operators seen, torch.compile."""
        notes = []
        if self._uncounted:
            notes.append(f"not counted: {', '.join(sorted(self._uncounted))}")
        if self._compiled:
            notes.append("torch.compile in use: matrix work inside generated kernels or CUDA graphs is not seen")
        self._note = ("lower bound: " + "; ".join(notes)) if notes else ""


def _why_not_count() -> str:
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
    if not hasattr(TorchDispatchMode, "ignore_compile_internals") and _compiled_anything():
        # Older torch runs compiled code eagerly under any dispatch mode (more memory, fullgraph errors).
        return "torch.compile is in use and this torch would run it eagerly under counting: not counted"
    return ""


def _in_compiled_frame(torch: Any) -> bool:
    """Whether this code runs inside a frame dynamo manages (its eval-frame callback is set)."""
    try:
        return torch._C._dynamo.eval_frame.get_eval_frame_callback() is not None
    except Exception:
        return False


def _dispatch_on() -> bool:
    """Whether this thread's dispatcher still routes operators to the dispatch modes on its stack."""
    import torch

    return bool(torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.Python))


def _compiled_anything() -> bool:
    """Whether dynamo has compiled a frame in this process (read from its own record; never imports it)."""
    utils: Any = sys.modules.get("torch._dynamo.utils")
    try:
        return bool(utils is not None and getattr(utils, "_compilation_metrics", None))
    except Exception:
        return False


def _pop_if_top(mode: Any) -> bool:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    leave = mode.__exit__
    if _get_current_dispatch_mode() is not mode:
        return False
    leave(None, None, None)
    return True


# -- the dispatch mode --------------------------------------------------------------------------------------

_MODE_CLASS: Any = None


def _counting_mode_class() -> Any:
    """The ``TorchDispatchMode`` that counts, built once on first use (``type()``: this module imports torch
    only here, and mypy checks it where torch is absent too)."""
    global _MODE_CLASS
    if _MODE_CLASS is not None:
        return _MODE_CLASS
    import torch
    from torch._ops import HigherOrderOperator
    from torch.utils._python_dispatch import TorchDispatchMode

    graph_task_id: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", lambda: 0)
    disabled = torch._C._disabled_torch_dispatch_impl
    no_data = _dataless_tensor_classes()

    def init(self: Any) -> None:
        TorchDispatchMode.__init__(self)
        self.registry = _formula_table()
        self.plans = _PLANS.setdefault(id(self.registry), {})  # decided once per operator and table
        self.segment = _Segment(None)
        self.inert = False  # passes operators on, counts nothing
        self.failure = ""
        self.ops = 0
        self.uncounted = {}

    def plan(self: Any, func: Any) -> tuple[int, Any, str]:
        if isinstance(func, HigherOrderOperator):
            formula = self.registry.get(func)
            name = f"higher_order.{getattr(func, '_name', func)}"
            found = (_COUNT, formula, name) if formula is not None else (_WORK, None, name)
        else:
            packet = func._overloadpacket
            formula = self.registry.get(packet)
            name = str(packet)
            if formula is not None:
                found = (_COUNT, formula, name)
            elif _does_work(func.namespace, func._opname):
                found = (_WORK, None, name)
            else:
                found = (_PASS, None, name)
        self.plans[func] = found
        return found

    def subclassed(self: Any, types: Any) -> int:
        """Whether an operand is a tensor subclass with a ``__torch_dispatch__`` of its own (``types`` may also
        hold ``torch.Tensor`` itself, whose is disabled): 0 none, 1 one that computes on tensors it holds,
        2 one that stands for no data (a fake or functional tensor)."""
        found = 0
        for kind in types:
            if getattr(kind, "__torch_dispatch__", disabled) is not disabled:
                if issubclass(kind, no_data):
                    return 2
                found = 1
        return found

    def dispatch(self: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if kwargs is None:
            kwargs = {}
        if types:
            subclass = self.subclassed(types)
            if subclass == 2:
                # Shapes without data: DTensor's sharding propagation, a tracer.  No work, and the subclass
                # refuses a mode it does not know on the stack, so it runs here, where this mode is off it.
                return func(*args, **kwargs)
            if subclass:
                # A tensor subclass (DTensor, a float8 or nested tensor): let it run its operators, which come
                # back here on plain tensors, so a rank counts its own shard's work.
                return NotImplemented
        out = func(*args, **kwargs)  # first, and as it is: a counting never changes what runs
        if self.inert:
            return out
        try:
            found = self.plans.get(func)
            if found is None:
                found = plan(self, func)
            kind = found[0]
            segment = self.segment
            if graph_task_id() == -1:
                segment.forward_ops += 1
            else:
                segment.backward_ops += 1
            if kind == _COUNT:
                formula, by_shape = found[1]
                if by_shape:
                    flops = int(formula(*_shapes(args), out_shape=_shape(out), **_shape_kwargs(kwargs)))
                else:  # a formula torch registered raw (get_raw): tensors in, as FlopCounterMode calls it
                    flops = int(formula(*args, **kwargs, out_val=out))
                segment.flops += flops
                dtype = _dtype_of(args, found[2])
                segment.by_dtype[dtype] = segment.by_dtype.get(dtype, 0) + flops
            elif kind == _WORK:
                self.uncounted[found[2]] = self.uncounted.get(found[2], 0) + 1
            self.ops += 1
            if self.ops > MAX_OPS:
                self.inert = True
                self.failure = f"more than {MAX_OPS} operators in one step"
        except Exception as exc:
            self.inert = True
            self.failure = _reason(exc)
        return out

    attributes: dict[str, Any] = {
        "__init__": init,
        "__torch_dispatch__": dispatch,
        "subclassed": subclassed,
        "supports_higher_order_operators": True,
        # Compiled code runs compiled under the mode (never eagerly: that changes its memory, and raises where
        # a function was compiled with fullgraph=True); the mode sees the kernels it calls through the
        # dispatcher (cuBLAS matmuls, attention) but not generated ones: the figure is then a lower bound.
        "ignore_compile_internals": classmethod(lambda cls: True),
    }
    _MODE_CLASS = type("_FlopCountingMode", (TorchDispatchMode,), attributes)
    return _MODE_CLASS


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


def _shape(value: Any) -> Any:
    """A formula's view of an operator's argument or output, as torch's ``shape_wrapper`` gives it: a tensor's
    shape, a list or tuple with its tensors' shapes, anything else as it is (no pytree walk: ~1 µs, not ~20)."""
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return shape
    if type(value) is list or type(value) is tuple:
        return type(value)(_shape(item) for item in value)
    return value


def _shapes(args: Any) -> list[Any]:
    return [_shape(arg) for arg in args]


def _shape_kwargs(kwargs: Any) -> dict[str, Any]:
    return {name: _shape(value) for name, value in kwargs.items()} if kwargs else {}


_TABLE: dict[Any, tuple[Any, bool]] | None = None
_TABLE_SIZE = -1
_PLANS: dict[int, dict[Any, Any]] = {}  # each operator's plan, by the table it was made from


def _formula_table() -> dict[Any, tuple[Any, bool]]:
    """Every formula a counting uses, by operator: (formula, called with shapes).  torch's table (and what a script
    registered into it), read again when it has grown, then ``formulas()`` for the operators it lacks and for
    the matrix multiplications it has, whose formulas call each other through the shape wrapper's pytree walk
    (~35 µs an operator; these count the same in a microsecond)."""
    global _TABLE, _TABLE_SIZE
    from torch.utils import flop_counter

    registry: Mapping[Any, Any] = flop_counter.flop_registry
    if _TABLE is not None and len(registry) == _TABLE_SIZE:
        return _TABLE
    wrapped_code = flop_counter.shape_wrapper(_shapes).__code__
    table: dict[Any, tuple[Any, bool]] = {}
    for target, formula in registry.items():
        inner = getattr(formula, "__wrapped__", None)
        if inner is not None and getattr(formula, "__code__", None) is wrapped_code:
            table[target] = (inner, True)
        else:
            table[target] = (formula, False)
    for target, formula in formulas().items():
        table[target] = (formula, True)
    _TABLE, _TABLE_SIZE = table, len(registry)
    _PLANS.clear()
    return table


def _mm(a: Any, b: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    m, k = a
    return int(2 * m * k * b[1])  # torch.utils.flop_counter.mm_flop's count


def _addmm(bias: Any, a: Any, b: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return _mm(a, b)


def _bmm(a: Any, b: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    batch, m, k = a
    return int(2 * batch * m * k * b[2])  # torch.utils.flop_counter.bmm_flop's count


def _baddbmm(bias: Any, a: Any, b: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    return _bmm(a, b)


_EXTRA: dict[Any, Any] | None = None


def formulas() -> dict[Any, Any]:
    """gputop's own formulas, called with shapes (``EXTRA_FORMULAS`` by name): the operators torch's table lacks
    (the CPU's fused attention and its backward, ``_addmm_activation``, ``addbmm``) and the matrix
    multiplications it has, each the same count torch's table gives (tests/unit/test_flops.py compares them).
    """
    global _EXTRA
    if _EXTRA is not None:
        return _EXTRA
    extra: dict[Any, Any] = {}
    try:
        import torch
        from torch.utils import flop_counter

        aten = torch.ops.aten

        def cpu_sdpa(query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
            return int(flop_counter.sdpa_flop_count(query, key, value))

        def cpu_sdpa_backward(
            grad_out: Any, query: Any, key: Any, value: Any, *args: Any, out_shape: Any = None, **kwargs: Any
        ) -> int:
            return int(flop_counter.sdpa_backward_flop_count(grad_out, query, key, value))

        for name, formula in (
            ("mm", _mm),
            ("addmm", _addmm),
            ("_addmm_activation", _addmm),
            ("bmm", _bmm),
            ("baddbmm", _baddbmm),
            ("addbmm", _baddbmm),
            ("_scaled_dot_product_flash_attention_for_cpu", cpu_sdpa),
            ("_scaled_dot_product_flash_attention_for_cpu_backward", cpu_sdpa_backward),
        ):
            packet = getattr(aten, name, None)
            if packet is not None:
                extra[packet] = formula
    except Exception:
        pass  # an older torch without these operators or helpers: torch's table alone
    _EXTRA = extra
    return extra


EXTRA_FORMULAS = (
    "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._scaled_dot_product_flash_attention_for_cpu_backward",
    "aten._addmm_activation",
    "aten.addbmm",
)


# -- the device's side: TF32 settings and the CPU's achievable peak ----------------------------------------


def tf32_modes() -> tuple[bool, bool]:
    """Whether float32 matrix multiplications and float32 convolutions may run on TF32 tensor cores now:
    (matmul, conv).  torch 2.9+'s ``fp32_precision`` first, then the older flags (reading
    ``allow_tf32`` raises where a script mixed the two APIs).  (False, False) where torch cannot say.
    """
    try:
        import torch
    except Exception:
        return False, False
    matmul = conv = False
    try:
        precision = getattr(torch.backends.cuda.matmul, "fp32_precision", "none")
        if precision in ("tf32", "ieee"):
            matmul = precision == "tf32"
        else:
            matmul = torch.get_float32_matmul_precision() in ("high", "medium")
    except Exception:
        pass
    try:
        precision = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", "none")
        conv = precision == "tf32" if precision in ("tf32", "ieee") else bool(torch.backends.cudnn.allow_tf32)
    except Exception:
        pass
    return matmul, conv


def measure_cpu_peak(
    size: int = 512, budget_s: float = 0.15, dtype: str = "float32"
) -> tuple[float | None, float, str]:
    """What this rank's CPU achieves on a dense matmul, measured once on the calling thread with torch's
    current thread count: (FLOP/s or None, seconds it cost, why None).

    A ``size`` x ``size`` matmul (512: three float32 matrices in 3 MiB, in a server CPU's cache; 256 read ~20%
    lower here, 1024 no higher), repeated for about ``budget_s`` after one warm-up call; the best of several
    batches of at least 5 ms, as ``timeit`` does, so a moment's contention does not lower it.  The peak a CPU
    rank's MFU is read against: no table can know a CPU's (docs/mfu.md: 200 GFLOP/s for 152 ms on 2 EPYC
    cores).
    """
    started = time.perf_counter()
    try:
        import torch

        kind = getattr(torch, dtype)
        a = torch.randn(size, size).to(kind)
        b = torch.randn(size, size).to(kind)
        out = torch.empty(size, size, dtype=kind)
        flops_per_call = 2 * size**3
        torch.mm(a, b, out=out)  # warm-up: the first call allocates and picks the kernel
        best = float("inf")
        calls = 1
        deadline = started + budget_s
        while True:
            t0 = time.perf_counter()
            for _ in range(calls):
                torch.mm(a, b, out=out)
            elapsed = time.perf_counter() - t0
            if elapsed < 0.005:  # batches of at least ~5 ms: a clock read is no part of the figure
                calls *= 2
                continue
            best = min(best, elapsed / calls)
            if time.perf_counter() >= deadline:
                break
        return flops_per_call / best, time.perf_counter() - started, ""
    except Exception as exc:
        return None, time.perf_counter() - started, f"the CPU's peak could not be measured: {_reason(exc)}"
