"""The only gputop code that runs on the training thread: step and loader timing.

Everything here touches memory only: a ``perf_counter()`` call, a float add, a
``deque.append`` (atomic under the GIL, so the reporter thread can ``popleft``
without a lock).  No I/O, no CUDA synchronisation, and every entry point is
wrapped so that a failure inside gputop is counted and never reaches training.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

T = TypeVar("T")

_perf = time.perf_counter  # a global, not ``time.perf_counter``: one lookup less on every call of the training thread

# A reporter thread that stops draining (it never should) must not let the
# training process grow without bound: at 1 kHz steps this is ~65 s of steps.
MAX_PENDING_STEPS = 65536


class StepMark(NamedTuple):
    """One finished step, as the training thread saw it (a tuple: cheapest to build per step)."""

    end_s: float  # perf_counter at the step mark
    duration_s: float | None  # since the previous mark; None for the first step
    loader_wait_s: float  # blocked in the tracked loader during this step
    batches: int  # batches fetched from the tracked loader during this step
    optimizer_s: float | None = None  # in optimizer steps during this step; None: no pre-hook times them
    # From the previous mark to the end of this step's last training forward: when the rank was ready to
    # exchange gradients, as far as the training thread can tell.  None: no forward hook saw one.
    ready_s: float | None = None
    # The step's phases from the watched model's hooks and the timed collectives (``StepClock.times_phases``),
    # for stacks whose wrapper does not time them (all but DDP): the training forwards and what followed each
    # up to the next forward or the optimizer step (backward), each less the collectives' exposed time within
    # it; and that exposed time over the whole step.  None where not timed.
    forward_s: float | None = None
    backward_s: float | None = None
    exposed_comm_s: float | None = None
    # How long the forward that ended at ``ready_s`` took (its pre- to post-hook): the part of the rank's
    # readiness that is this step's work, which varies from batch to batch.  Read only with ``ready_s``: the
    # training thread copies the last forward's length into every mark (cheaper than asking whether it is new).
    ready_forward_s: float | None = None
    # How many elements that forward's input held (its first tensor argument): the batch's size in samples x
    # tokens, which varies with padding to the longest text.  -1: no tensor argument (or none seen).
    ready_input_numel: int = -1


def input_numel(args: Any, kwargs: Any) -> int:
    """Elements in a forward's input, as its pre-hook sees it: the first positional argument, else the first
    keyword's (``model(**batch)``), looked into when it is a tuple, list or dict of tensors; -1 where none is a
    tensor.  Duck-typed (``numel``): this module does not import torch, and never raises into training.
    """
    try:
        first: Any = args[0] if args else next(iter(kwargs.values())) if kwargs else None
        kind = type(first)
        if kind is tuple or kind is list:
            first = first[0] if first else None
        elif kind is dict:
            first = next(iter(first.values()), None)
        numel = getattr(first, "numel", None)  # no exception on the way: raising one costs a microsecond
        return numel() if numel is not None else -1
    except Exception:
        return -1


def output_node(output: Any) -> Any:
    """The autograd node the watched model's output came from: its first tensor with a ``grad_fn``, the output
    itself or looked into a tuple, list or dict (a ``ModelOutput`` is an ``OrderedDict``); None where no gradient
    can flow into it (no_grad, a leaf, no tensor).  Duck-typed like ``input_numel``; never raises into training.
    """
    try:
        items = output if isinstance(output, (tuple, list)) else output.values() if isinstance(output, dict) else ()
        node = getattr(output, "grad_fn", None) if not items else None
        for item in items:
            node = getattr(item, "grad_fn", None)
            if node is not None:
                break
        return node
    except Exception:
        return None


class GpuSteps(Protocol):
    """What times a step on the GPU (``RankCuda``, or ``CudaTimeline`` around it): told at every step's end."""

    def record_step(self) -> None: ...


class StepClock:
    """Collects step marks and loader waits from the training thread."""

    def __init__(self) -> None:
        self.marks: deque[tuple[Any, ...]] = deque(maxlen=MAX_PENDING_STEPS)  # StepMark fields, in order
        self.errors = 0  # failures swallowed on the training thread
        # Set by the reporter when the model is on one CUDA device: a RankCuda, which keeps the step events, or
        # (off DDP) the CudaTimeline that records them and the step's end on its phase timeline too.
        self.gpu_steps: GpuSteps | None = None
        # Forwards of the watched model (its pre-hook counts them), and the count at the last step mark:
        # the stack sampler tells "after the optimizer step" from "before it" by whether they differ.
        self.forwards = 0
        self.forwards_at_mark = 0
        # perf_counter when the watched model's last training forward ended (its post-hook).
        self.forward_end_s = 0.0
        # perf_counter when it began (its pre-hook), and how long it took (set with forward_end_s).
        self.forward_start_s = 0.0
        self.forward_length_s = 0.0
        self.forward_numel = -1  # elements in its first tensor argument (set with forward_start_s); -1: none
        self._loader_wait_s = 0.0
        self._batches = 0
        self._last_mark_s: float | None = None
        # The optimizer's step, timed from its pre-hook to its post-hook (all optimizers, summed a step):
        self.times_optimizer = False  # set once the reporter's pre-hook is installed
        self._optimizer_s = 0.0
        self._optimizer_t0 = 0.0
        # Optimizers stepping inside each other (a wrapper such as ZeroRedundancyOptimizer steps its
        # inner one): the clock runs from the outermost pre-hook to the outermost post-hook.
        self._optimizer_depth = 0
        # Where the backward's start is told from the forward's end (``marks_backward``, set by the reporter: phases
        # from hooks, or DDP's logger, on the CPU), a training forward's post-hook puts a pre-hook on the autograd
        # node of the model's output, and the gradient reaching it marks the backward's start (``backward_started``).
        self.marks_backward = False
        self.backward_pending = False  # a training forward's output is hooked and its backward has not begun
        # From a forward's end to its backward's start (the script's loss, a metric, a log line: not the model's
        # work), summed over the backwards the hook saw begin, and how many: one tuple, replaced whole on the
        # training thread, so the reporter thread reads both together (DDP's probe takes them out of its backward).
        self.pre_backward: tuple[float, int] = (0.0, 0)
        # Seconds the training thread was blocked in collectives, a running total the collective tap adds to.
        self.comm_exposed_s = 0.0
        # The phases from hooks, for every stack but DDP (whose logger times them) off CUDA: set by the reporter.
        # On CUDA the hooks would time kernel launches: the CudaTimeline times the phases on the GPU clock there.
        self.times_phases = False
        self._forward_s = 0.0  # this step's forwards, less the exposed collectives inside them
        self._backward_s = 0.0  # this step's backward spans, likewise
        self._span_t0: float | None = None  # the open span's start: a forward's, or a backward's
        self._span_comm = 0.0  # comm_exposed_s at that start
        self._span_loader = 0.0  # and the step's loader wait then (micro-batches fetched between spans)
        self._in_forward = False
        self._comm_at_mark = 0.0
        self._forwards_timed = 0  # training forwards the hooks marked in this step: none, no phases (N/A, not 0)
        # The optimizer's closure (Lightning runs forward and backward inside optimizer.step(closure)): its time
        # is the step's forward and backward, not the optimizer's.
        self._closure_s = 0.0
        self._closure_t0 = 0.0

    @property
    def batches_since_mark(self) -> int:
        """Batches fetched from the tracked loader since the last step mark."""
        return self._batches

    @property
    def stepped(self) -> bool:
        """A step has been marked."""
        return self._last_mark_s is not None

    def since_mark_s(self) -> float | None:
        """Seconds since the last step mark (None before the first); any thread may ask."""
        last = self._last_mark_s
        return None if last is None else time.perf_counter() - last

    def add_loader_wait(self, seconds: float) -> None:
        self._loader_wait_s += seconds
        self._batches += 1

    def optimizer_started(self) -> None:
        """An optimizer's step begins (its pre-hook)."""
        depth = self._optimizer_depth = self._optimizer_depth + 1
        if depth == 1:
            self._optimizer_t0 = now = _perf()
            if self.times_phases and not self._in_forward:
                self._close_backward(now)

    def closure_started(self) -> None:
        """The outermost optimizer's closure begins: forward and backward run inside ``optimizer.step(closure)``."""
        if self._optimizer_depth:
            self._closure_t0 = time.perf_counter()

    def closure_done(self) -> None:
        """The closure returned: its time leaves the optimizer's, and the backward it ran ends here."""
        if self._optimizer_depth and self._closure_t0:
            now = time.perf_counter()
            self._closure_s += now - self._closure_t0
            self._closure_t0 = 0.0
            if self.times_phases and not self._in_forward:
                self._close_backward(now)

    # -- phases from hooks (training thread) -----------------------------------------

    def forward_started(self, now: float) -> None:
        """A training forward of the watched model begins: what ran since the last one ended was its backward."""
        if not self._in_forward:
            self._close_backward(now)
            self._in_forward = True
            self._forwards_timed += 1
            self._span_t0, self._span_comm, self._span_loader = now, self.comm_exposed_s, self._loader_wait_s

    def forward_done(self, now: float) -> None:
        """The training forward ended: its time counts, and the backward span opens."""
        if self._in_forward and self._span_t0 is not None:
            comm = self.comm_exposed_s
            self._forward_s += max(now - self._span_t0 - (comm - self._span_comm), 0.0)
            self._in_forward = False
            self._span_t0, self._span_comm, self._span_loader = now, comm, self._loader_wait_s

    def backward_started(self, now: float) -> None:
        """The gradient reached the watched model's output (the autograd pre-hook the forward's post-hook put there):
        the backward of the last training forward begins.

        What ran between that forward's end and now was the script's (the loss, a metric computed in Python, a log
        line), not the model's backward: its length is added to ``pre_backward``, and with phases from hooks the
        backward span opens here instead, so that time falls outside the phases ("other").  A backward the hook
        never sees begin (the loss does not use the output's first tensor) is timed from the forward's end, as
        before.  Only the first pre-hook after a forward counts (several outputs, ``retain_graph``).
        """
        if not self.backward_pending:
            return
        self.backward_pending = False
        gap = now - self.forward_end_s
        if gap >= 0.0:
            total, count = self.pre_backward
            self.pre_backward = (total + gap, count + 1)
        if self.times_phases and not self._in_forward and self._span_t0 is not None:
            self._span_t0, self._span_comm, self._span_loader = now, self.comm_exposed_s, self._loader_wait_s

    def _close_backward(self, now: float) -> None:
        if self._span_t0 is not None and not self._in_forward:
            waited = (self.comm_exposed_s - self._span_comm) + (self._loader_wait_s - self._span_loader)
            self._backward_s += max(now - self._span_t0 - waited, 0.0)
            self._span_t0 = None

    def optimizer_done(self, mark: bool = False) -> None:
        """An optimizer's step ended (its post-hook): the outermost one's time counts towards the current step.

        ``mark``: the step ends here too (the primary optimizer's post-hook): marked with the same clock
        read, in the same call (one read and one call less on the training thread, every step).
        """
        depth = self._optimizer_depth
        if depth != 1:
            # 0: a step whose pre-hook came before gputop watched; more: an inner optimizer (a wrapper steps
            # it), and the outermost one's clock runs on.
            if depth:
                self._optimizer_depth = depth - 1
            if mark:
                self.mark_step()
            return
        self._optimizer_depth = 0
        now = _perf()
        closure = self._closure_s
        spent = now - self._optimizer_t0 - closure
        optimizer_s = self._optimizer_s + spent if spent > 0.0 else self._optimizer_s
        if closure:
            self._closure_s = 0.0
        if not mark or self.gpu_steps is not None or self.times_phases:
            self._optimizer_s = optimizer_s
            if mark:
                self.mark_step(now)
            return
        # mark_step(now), inlined: this is every step of every optimizer-driven loop (a call costs ~60 ns).
        last = self._last_mark_s
        self._last_mark_s = now
        end = self.forward_end_s
        self.marks.append(
            (now, None if last is None else now - last, self._loader_wait_s, self._batches, optimizer_s,
             None if last is None or end <= last else end - last, None, None, None,
             self.forward_length_s, self.forward_numel)
        )  # fmt: skip
        self._loader_wait_s = 0.0
        self._batches = 0
        self._optimizer_s = 0.0
        self.forwards_at_mark = self.forwards

    def mark_step(self, now: float | None = None) -> None:
        """Close the current step.  Called from the optimizer post-hook or ``gputop.step()``.

        ``now``: the post-hook's clock read that ended the optimizer's step (``optimizer_done``), else read here.
        """
        if now is None:
            now = _perf()
        gpu_steps = self.gpu_steps
        if gpu_steps is not None:
            self._record_gpu_step(gpu_steps)
        last = self._last_mark_s
        self._last_mark_s = now
        end = self.forward_end_s
        # A plain tuple: a NamedTuple's __new__ is Python code; the reporter thread names the fields.
        if self.times_phases:
            self.marks.append(self._phased_mark(now, last, end))
        else:
            self.marks.append(
                (now, None if last is None else now - last, self._loader_wait_s, self._batches,
                 self._optimizer_s if self.times_optimizer else None,
                 None if last is None or end <= last else end - last, None, None, None,
             self.forward_length_s, self.forward_numel)
            )  # fmt: skip
        self._loader_wait_s = 0.0
        self._batches = 0
        self._optimizer_s = 0.0
        self.forwards_at_mark = self.forwards

    def _record_gpu_step(self, gpu_steps: GpuSteps) -> None:
        try:
            gpu_steps.record_step()
        except Exception:
            self.errors += 1
            self.gpu_steps = None  # keep timing steps without GPU events

    def _phased_mark(self, now: float, last: float | None, end: float) -> tuple[Any, ...]:
        """The step mark with its phases from hooks (``times_phases``: every stack but DDP, off CUDA)."""
        if not self._in_forward:
            self._close_backward(now)
        comm, self._comm_at_mark = self.comm_exposed_s - self._comm_at_mark, self.comm_exposed_s
        # No training forward marked in this step (the watched module is not the one that runs): N/A, not 0.
        timed = self._forwards_timed > 0
        phases: tuple[float | None, ...] = (self._forward_s, self._backward_s, comm) if timed else (None,) * 3
        self._forward_s = self._backward_s = 0.0
        self._forwards_timed = 0
        return (now, None if last is None else now - last, self._loader_wait_s, self._batches,
                self._optimizer_s if self.times_optimizer else None,
                None if last is None or end <= last else end - last, *phases,
                self.forward_length_s, self.forward_numel)  # fmt: skip

    def drain(self) -> list[StepMark]:
        """Take every mark so far (reporter thread)."""
        out = []
        marks = self.marks
        make = StepMark._make
        while True:
            try:
                out.append(make(marks.popleft()))
            except IndexError:
                return out


class TrackedLoader(Generic[T]):
    """Wraps an iterable (usually a DataLoader) and times each wait for the next batch.

    Behaves like the wrapped loader: same batches, same ``len()``, attribute
    access passes through.  The wrapped loader's own exceptions propagate
    unchanged; gputop adds none.
    """

    def __init__(self, loader: Iterable[T], clock: StepClock) -> None:
        self._loader = loader
        self._clock = clock

    def __iter__(self) -> Iterator[T]:
        clock = self._clock
        perf = time.perf_counter
        start = perf()
        iterator = iter(self._loader)  # starting non-persistent workers is loader time too
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                return
            clock.add_loader_wait(perf() - start)
            yield batch
            start = perf()

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)
