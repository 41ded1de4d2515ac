"""Where the training thread is: its Python stack, sampled from the reporter thread.

``sys._current_frames()`` hands the reporter thread the training thread's
innermost frame; the training thread runs no gputop code for it and pays
only the GIL handoff any thread's wake-up costs it.  Each sample walks the
frames outwards and finds (a) the innermost frame of the user's own code (not
the standard library, site-packages, torch or gputop) and (b) what the thread
is inside: the loader, the watched model's forward, backward, the optimizer's
step, a ``torch.distributed`` collective; else where it is in the step: after
the optimizer step, or between the forward and the step (from the step
clock's counts), or "outside" when no model is watched.

Cheap by construction: what a code object is (the user's? a marker?) is
worked out once and cached by the code's id (the cache holds the code, so the
id cannot be reused by another); a sample is a dict lookup per frame up to the
first user frame and the first marker, and one tally of ``(where, code id,
line)``.  Nothing is formatted per sample: names are made once a second, for
the few places a ``Stacks`` message names (per function, under its
most-sampled line: ``by_function``).  The rate adapts: when the median
sample of the last second costs more than ``BUDGET_FRAC`` of a core at the
configured rate, the interval grows until it does not.

Each interval is drawn at random around the configured one (0.5x to 1.5x).
A fixed interval can beat against the step: at an interval of exactly 2.5
steps every sample falls at the step's start or middle, and a part of the
step elsewhere is never seen (tests/unit/test_stack_sampler.py).  A rank that
computed a metric for 11% of each step showed it in 4% of its samples at a
fixed 143 ms.  The random spread is wider than any step short enough to beat,
so the samples see each part of the step in proportion to its time (the
interval's mean, and so the cost, are unchanged).  What it cannot undo is the
GIL: a pure-Python stretch shorter than the 5-ms switch interval is sampled
where the thread next releases the GIL.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Mapping
from types import CodeType
from typing import Any

from gputop import settings
from gputop.protocol import STACKS_TOP, SampledFrame, StackFrame, Stacks
from gputop.reporter import collectives
from gputop.reporter.clock import StepClock, TrackedLoader

DEFAULT_HZ = settings.STACKS_HZ.default
BUDGET_FRAC = 0.001  # of one core: the sampler's cost at most, whatever the rate asked for
MAX_DEPTH = 256  # frames walked per sample: a deeper stack (a recursion) is cut there
SEND_EVERY_S = 1.0  # a stacks message a second: a 10-s span holds ten, a hang's place is at most a second old
JITTER = 0.5  # each interval is the configured one x uniform(1 - JITTER, 1 + JITTER): no beat with the step
MAX_CODES = 20_000  # code objects classified before the cache starts over (code made at run time: exec, compile)

# Where the thread is, when a marker frame is on its stack (innermost marker first).
LOADER, FORWARD, BACKWARD, OPTIMIZER, COLLECTIVE = "loader", "forward", "backward", "optimizer", "collective"
# Otherwise, where it is in the step.
AFTER_STEP, BEFORE_STEP, OUTSIDE = "after_step", "before_step", "outside"

# Paths inside the torch package ("/" separated) and the functions that mark a phase.
_COLLECTIVE_FUNCTIONS = frozenset(
    {
        "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_object",
        "all_gather_single", "reduce_scatter_single",  # torch 2.13's names, which FSDP2 calls
        "_all_gather_base", "_reduce_scatter_base",  # the older ones DeepSpeed and Megatron call
        "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
        "broadcast", "broadcast_object_list", "reduce", "scatter", "scatter_object_list", "gather",
        "gather_object", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv",
        "send_object_list", "recv_object_list",
    }
)  # fmt: skip
# The collective tap's wrappers around waits (gputop.reporter.collectives): while a rank waits in C++ for an
# asynchronous collective, the innermost Python frame is the wrapper's.
_TAP_FILE = collectives.__file__
_TAP_WAITS = frozenset({"wait", "wait_tensor"})
_BACKWARD_FILES = frozenset({"_tensor.py", "autograd/__init__.py", "autograd/graph.py"})
_BACKWARD_FUNCTIONS = frozenset({"backward", "grad", "_engine_run_backward"})
_NOT_OPTIMIZER = frozenset({"optim/lr_scheduler.py", "optim/swa_utils.py"})

# (the code, kept so its id stays its own; the user's code?; marker or None; file as shown)
Kind = tuple[CodeType, bool, str | None, str]
TallyKey = tuple[str, int, int]  # where, id of the innermost user code (0: none), its line


def configured_hz(environ: Mapping[str, str]) -> tuple[float | None, str]:
    """The sampling rate ``GPUTOP_STACKS`` and ``GPUTOP_STACKS_HZ`` ask for (None: off), and what was wrong."""
    if not settings.STACKS.value(environ):
        return None, ""
    reading = settings.STACKS_HZ.reading(environ)
    return reading.value, reading.problem


def forward_codes(model: Any) -> tuple[CodeType, ...]:
    """The code of the watched model's ``forward``, and of what it wraps (DDP's module, torch.compile's original)."""
    codes = []
    for module in (model, getattr(model, "module", None), getattr(model, "_orig_mod", None)):
        code = getattr(getattr(type(module), "forward", None), "__code__", None) if module is not None else None
        if isinstance(code, CodeType) and code not in codes:
            codes.append(code)
    return tuple(codes)


def function_name(code: CodeType) -> str:
    """ "Metric.update", "wait_for_lock" (a nested function without its "outer.<locals>." prefix)."""
    return getattr(code, "co_qualname", code.co_name).rsplit("<locals>.", 1)[-1]


class StackSampler:
    """Samples one thread's stack when due and tallies where it was; reporter thread only."""

    def __init__(self, thread_ident: int, *, hz: float = DEFAULT_HZ, clock: StepClock | None = None) -> None:
        """``thread_ident``: the training thread's ``threading.get_ident()``; ``clock``: its step clock."""
        self.thread_ident = thread_ident
        self.clock = clock
        self.base_interval_s = 1.0 / hz
        self.interval_s = self.base_interval_s  # grows when a sample costs more than the budget allows
        self.next_s = 0.0  # monotonic time of the next sample
        self._spread = random.Random()  # the interval's spread (its own generator: the user's seed is theirs)
        self.samples = 0  # since the last take()
        self.cost_s: float | None = None  # the median sample's cost over the last second with samples
        self._costs: list[float] = []
        self.send_cost_s = 0.0  # what the last stacks message cost to make and queue (the reporter notes it)
        self._tallies: dict[TallyKey, int] = {}
        self._now: TallyKey | None = None
        self._since_t = time.time()
        self._kinds: dict[int, Kind] = {}
        self._user_files: dict[str, bool] = {}
        self._forward_codes: tuple[CodeType, ...] = ()
        self._forward_ids: frozenset[int] = frozenset()
        self._torch_dir: str | None = None
        self._cwd = os.path.join(os.getcwd(), "")
        self._library_dirs = _library_dirs()
        gputop_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self._gputop_dir = os.path.join(gputop_dir, "")
        self._demos_dir = os.path.join(gputop_dir, "demos", "")  # the demo's training script is the user's code
        self._tracked_loader = TrackedLoader.__iter__.__code__

    def watch_forwards(self, codes: tuple[CodeType, ...]) -> None:
        """The watched model's forward codes (``forward_codes``): frames of these are "forward"."""
        if codes == self._forward_codes:
            return
        self._forward_codes, self._forward_ids = codes, frozenset(id(c) for c in codes)
        kinds = self._kinds.items()
        self._kinds = {key: (code, user, self._marker(code), shown) for key, (code, user, _, shown) in kinds}

    def restart(self, now_s: float) -> None:
        """Start sampling afresh (a new connection): no tallies, the first sample now."""
        self._tallies.clear()
        self.samples = 0
        self._now = None
        self._since_t = time.time()
        self.next_s = now_s

    def sample_when_due(self, now_s: float, cpu_before_wake_s: float | None = None) -> None:
        """Take a sample if one is due at monotonic time ``now_s``, and note what it cost this thread.

        ``cpu_before_wake_s``: this thread's CPU time (``time.thread_time()``)
        before it went to sleep to wake for this sample.  The wake is most of
        the cost (the kernel, the GIL, caches gone cold: ~50 µs on a VM, the
        sample itself ~30 µs), and sampling is the only reason to wake that often.
        """
        if now_s < self.next_s:
            return
        start = time.thread_time() if cpu_before_wake_s is None else cpu_before_wake_s
        self.sample()
        self._costs.append(time.thread_time() - start)
        self.next_s = now_s + self.interval_s * self._spread.uniform(1.0 - JITTER, 1.0 + JITTER)

    def sample(self) -> None:
        """Where the thread is now: one tally."""
        frame = sys._current_frames().get(self.thread_ident)
        if frame is None:  # the thread has ended
            self._now = None
            return
        kinds = self._kinds
        user: CodeType | None = None
        line = 0
        marker: str | None = None
        depth = 0
        while frame is not None and depth < MAX_DEPTH:
            code = frame.f_code
            kind = kinds.get(id(code))
            if kind is None:
                kind = self._classify(code)
            if user is None and kind[1]:
                user, line = code, frame.f_lineno or 0
                if marker is not None:
                    break
            if marker is None and kind[2] is not None:
                marker = kind[2]
                if user is not None:
                    break
            frame = frame.f_back
            depth += 1
        key = (marker or self._step_position(), 0 if user is None else id(user), line)
        self._tallies[key] = self._tallies.get(key, 0) + 1
        self.samples += 1
        self._now = key

    def take(self, run_id: str, rank: int, now_t: float) -> Stacks:
        """The tallies since the last take as a ``Stacks`` message (the top places and the newest); start over."""
        tallies, self._tallies = self._tallies, {}
        samples, self.samples = self.samples, 0
        ranked = sorted(by_function(tallies).items(), key=lambda item: item[1], reverse=True)[:STACKS_TOP]
        stacks = Stacks(
            run_id=run_id,
            rank=rank,
            t=now_t,
            period_s=max(now_t - self._since_t, 0.0),
            interval_s=self.interval_s,
            samples=samples,
            top=tuple(SampledFrame(*self._names(key), count) for key, count in ranked),
            now=None if self._now is None else StackFrame(*self._names(self._now)),
        )
        self._since_t = now_t
        self._adapt()
        if len(self._kinds) > MAX_CODES:  # no tally refers to a code now: the cache may start over
            self._kinds.clear()
            self._now = None
        return stacks

    def _adapt(self) -> None:
        """Set the interval from the median sample's cost, its wake included: one slow sample does not count."""
        if not self._costs:
            return
        self._costs.sort()
        self.cost_s = self._costs[len(self._costs) // 2]
        self._costs.clear()
        # The message a second comes out of the same budget: what is left of it pays for the samples.
        left_frac = max(BUDGET_FRAC - self.send_cost_s / SEND_EVERY_S, BUDGET_FRAC / 4)
        self.interval_s = max(self.base_interval_s, self.cost_s / left_frac)

    def _names(self, key: TallyKey) -> tuple[str, str, int, str]:
        where, code_id, line = key
        kind = self._kinds.get(code_id) if code_id else None
        if kind is None:
            return where, "", 0, ""
        return where, kind[3], line, function_name(kind[0])

    def _step_position(self) -> str:
        """No marker on the stack: after the optimizer step, or between the forward and the step."""
        clock = self.clock
        if clock is None or clock.forwards == 0 or not clock.stepped:
            return OUTSIDE  # no forward or no step seen: the step's phases are unknown
        return BEFORE_STEP if clock.forwards != clock.forwards_at_mark else AFTER_STEP

    # -- what a code object is (once per code) ----------------------------------------------

    def _classify(self, code: CodeType) -> Kind:
        filename = code.co_filename
        user = self._user_files.get(filename)
        if user is None:
            user = self._user_files[filename] = self._is_user_file(filename)
        kind = (code, user, self._marker(code), self._shown_file(filename) if user else "")
        self._kinds[id(code)] = kind
        return kind

    def _is_user_file(self, filename: str) -> bool:
        if not filename or filename.startswith("<") or "site-packages" in filename or "dist-packages" in filename:
            return False
        if filename.startswith(self._gputop_dir):
            return filename.startswith(self._demos_dir)
        torch_dir = self._torch()
        return not filename.startswith(self._library_dirs) and not (torch_dir and filename.startswith(torch_dir))

    def _marker(self, code: CodeType) -> str | None:
        if id(code) in self._forward_ids:
            return FORWARD
        if code is self._tracked_loader:
            return LOADER
        if code.co_filename == _TAP_FILE and code.co_name in _TAP_WAITS:
            return COLLECTIVE  # blocked in a Work's wait() or a functional collective's: C++ under gputop's wrapper
        torch_dir = self._torch()
        filename = code.co_filename
        if torch_dir is None or not filename.startswith(torch_dir):
            return None
        path, name = filename[len(torch_dir) :].replace(os.sep, "/"), code.co_name
        if path.startswith("distributed/"):
            if path == "distributed/_functional_collectives.py" or (
                path == "distributed/distributed_c10d.py" and name in _COLLECTIVE_FUNCTIONS
            ):
                return COLLECTIVE
            return None
        if path.startswith("optim/") and path not in _NOT_OPTIMIZER:
            return OPTIMIZER
        if path in _BACKWARD_FILES and name in _BACKWARD_FUNCTIONS:
            return BACKWARD
        if path == "utils/data/dataloader.py" and name == "__next__":
            return LOADER
        return None

    def _torch(self) -> str | None:
        """torch's package folder, once torch is imported (no torch code runs before)."""
        if self._torch_dir is None:
            torch = sys.modules.get("torch")
            path = getattr(torch, "__file__", None)
            if path:
                self._torch_dir = os.path.join(os.path.dirname(path), "")
        return self._torch_dir

    def _shown_file(self, filename: str) -> str:
        """The file as a user names it: relative to the working folder when inside it, else its base name."""
        shown = filename[len(self._cwd) :] if filename.startswith(self._cwd) else os.path.basename(filename)
        return shown[-256:]


def by_function(tallies: dict[TallyKey, int]) -> dict[TallyKey, int]:
    """The samples per (where, function), each under its most-sampled line.

    A function whose time spreads over several lines (a metric: a loop, a sort,
    a conversion) is one place taking its share, not several small ones.
    """
    totals: dict[tuple[str, int], int] = {}
    top_line: dict[tuple[str, int], int] = {}
    for (where, code_id, line), count in sorted(tallies.items(), key=lambda item: -item[1]):
        totals[(where, code_id)] = totals.get((where, code_id), 0) + count
        top_line.setdefault((where, code_id), line)
    return {(where, code_id, top_line[where, code_id]): total for (where, code_id), total in totals.items()}


def _library_dirs() -> tuple[str, ...]:
    """Folders of code that is not the user's: the standard library and the installed packages."""
    import sysconfig

    dirs = {os.path.dirname(os.__file__)}  # the standard library, spelled as its modules' code names it
    paths = sysconfig.get_paths()
    dirs.update(paths[name] for name in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(name))
    return tuple(os.path.join(d, "") for d in sorted(dirs))
