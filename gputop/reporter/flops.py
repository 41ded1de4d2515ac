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
what runs.  The mode is ``flop_mode.py``, the formulas ``flop_formulas.py``; this module is the bookkeeping:
which shapes are counted, each step's sum, and why a figure is N/A.  Why not FlopCounterMode itself, and what
torch.compile does to the count: docs/mfu.md.

What is counted is the model's: operators between a training forward's pre-hook and its forward hook, and in
the backward (the autograd engine's graph task); what a step runs beside the model (a metric of matrix work
between the passes or after the backward) is its time, not the model's FLOPs (``forward_done``).  Within that,
what is counted is what ran: a frozen layer's weight gradient that autograd never computes is not counted, the
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

import threading
from collections.abc import Hashable
from typing import Any

from gputop.reporter.flop_mode import (
    Segment,
    compiled_anything,
    counting_mode_class,
    dispatch_on,
    pop_if_top,
    reason,
    why_not_count,
)

MAX_SHAPES = 16  # distinct input shapes (and whole-step shape lists) counted; new ones after that stay N/A
MAX_FORWARDS = 64  # training forwards in one counting: no step end by then and the counting is abandoned
MAX_FAILURES = 3  # countings that failed or were abandoned: after these, no more
MAX_KEY_TENSORS = 8  # tensors whose shapes make a forward's key
NAMES_KEPT = 6  # uncountable operators named in a note

NOT_YET = "model not counted yet"
NO_WORK = "no matrix multiplication, convolution or attention ran in the counted step"


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
        self._segments: list[Segment] = []
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

    def forward_done(self) -> None:
        """A training forward returned (the watched model's forward hook): until a backward or the next forward
        runs, the operators are work beside the model, not counted.  An attribute read when no counting runs."""
        mode = self._mode
        if mode is not None:
            mode.beside = True

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

    def count(self) -> tuple[int | None, str]:
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
        why = why_not_count()
        if why:
            self._why_not = why
            return False
        mode = counting_mode_class()()
        mode.__enter__()
        self._tried.add(key)
        self._mode = mode
        self._thread = threading.get_ident()
        self._segments = [Segment(key)]
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
        segment = Segment(key)
        self._segments.append(segment)
        mode.beside = False
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
        if not mode.failure and not dispatch_on():
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
        self._compiled = self._compiled or compiled_anything()
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
        if not pop_if_top(mode):
            self._stale.append(mode)
            self._why_not = "another dispatch mode was entered during the counting and is still active"

    def _retry_stale(self) -> None:
        while self._stale and pop_if_top(self._stale[-1]):
            self._stale.pop()

    def _segments_failed(self, segments: list[Segment]) -> None:
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
        self._why_not = f"counting failed: {reason(exc)}"
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
