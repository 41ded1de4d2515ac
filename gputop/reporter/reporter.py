"""The reporter, one per training process: what the training thread calls, and the hooks it installs.

``gputop.watch()`` creates and starts it.  On the training thread it reads the
process's and the model's facts, installs the optimizer's step hooks and the
model's forward pre-hook, picks the probes the model offers (``model_probes.py``:
DDP timings, CUDA memory, GPU step events) and marks steps: a step mark, from
the optimizer's post-hook or ``gputop.step()``, is ``clock.StepClock.mark_step``
and nothing more of substance (docs/architecture.md, "Training thread: a deque
append, nothing else").  Everything else happens on the reporter thread
(``reporter_thread.ReporterThread``), which the reporter owns and hands what the
training thread shares with it (``training_side.TrainingSide``).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from gputop import settings
from gputop.address import Address
from gputop.reporter import compiled, facts, stacks
from gputop.reporter.clock import input_numel, output_node
from gputop.reporter.compiled import WRAPPER, CompileWatch, compiled_call, form_of, learn_compiling
from gputop.reporter.device_peak import measure_cpu_peak
from gputop.reporter.flops import FlopCounter, shape_key
from gputop.reporter.model_probes import ModelProbes, hook_forward, marking_closure
from gputop.reporter.reporter_thread import EXIT_FLUSH_S, EXIT_LINGER_MIN_S, ReporterThread
from gputop.reporter.sigterm import SigtermBye
from gputop.reporter.training_side import TrainingSide

DEFAULT_WINDOW_S = settings.WINDOW_S.default
# Of SIGTERM's bound for the bye, the reporter thread's share (its last window and bye); the rest is for the bye
# on a connection of its own, where that thread is stuck (the DDP probe waits on DDP's lock during a hang).
BYE_OWN_SHARE = 0.6


def _forget_in_forked_children(reporter: Reporter) -> None:
    """Mark ``reporter`` forked in every child forked from here on (weakly: a reporter that is gone is left alone)."""
    ref = weakref.ref(reporter)

    def forked() -> None:
        found = ref()
        if found is not None:
            found._forked = found._model_probes.forked = True

    with contextlib.suppress(Exception):
        os.register_at_fork(after_in_child=forked)


class Reporter:
    """One per process; ``gputop.watch()`` creates and starts it."""

    def __init__(self, address: Address, *, window_s: float = DEFAULT_WINDOW_S, cuda: Any = None) -> None:
        """``cuda``: ``torch.cuda`` (None: imported when a model on CUDA is watched) or a stand-in for tests."""
        side = self.side = TrainingSide(window_s)
        self.clock = side.clock
        self.tap = side.tap  # the collectives it times (a GPU job marks a known wait with ``tap.waits_for``)
        self.pid = side.pid
        # Set in a forked child (a DataLoader worker inherits the hooks): the hooks then do nothing.  A flag, not
        # ``os.getpid() != self.pid`` per call: getpid is a system call, ~0.1-0.4 µs twice a step on a VM.
        self._forked = False
        self._model: Any = None
        self._forward_handles: list[Any] = []  # the watched model's forward hooks (``model.compile()`` moves them)
        self._hook_handles: list[Any] = []
        self._primary_optimizer: int | None = None
        self.manual_steps = False
        self._hook_marked = False  # the optimizer hook has marked a step (before any manual mark)
        # Under DDP only the forwards that synchronise gradients have their backward's start marked: DDP's logger
        # times no other (``no_sync()`` micro-batches), so no other's gap is taken out of its backward.
        self._sync_forwards_only = False
        self._cpu_peak_wanted = False  # a CPU rank measures its matmul peak once, in a step the counter slows anyway
        self.thread = ReporterThread(address, side)  # its sender, windows, stacks, node sampler
        self.sigterm = SigtermBye(side.ending, self._bye_on_sigterm)  # a bye, then death by SIGTERM
        self._model_probes = ModelProbes(side, self.thread.announcer, self._hook_handles, cuda)
        self._compile_watch = CompileWatch(self._on_compiled)  # the watched model's compiled forms get its hooks
        _forget_in_forked_children(self)

    # -- training thread ------------------------------------------------------------

    def start(self) -> None:
        side = self.side
        side.facts.update(facts.identity())
        side.facts.update(facts.torch_facts())
        self.thread.announcer.refresh_hello()
        learn_compiling()  # before the optimizer's hooks go in (a compiled step must find them folded away)
        self._install_step_hook()
        side.ending.install()
        self.sigterm.install()
        atexit.register(self.shutdown)
        try:  # multiprocessing children (mp.spawn) skip atexit but run these finalizers
            import multiprocessing.util

            multiprocessing.util.Finalize(self, self.shutdown, exitpriority=100)
        except Exception:
            pass
        self.thread.start()

    def attach_model(self, model: Any) -> None:
        """Read the model's facts and hook what it offers (DDP stats, autocast, CUDA events)."""
        if model is None or model is self._model:
            return
        self._model = model
        side, found = self.side, self.side.facts
        side.train_tid = threading.get_native_id()
        side.train_ident = threading.get_ident()
        self.thread.stacks.follow(side.train_ident)  # the first gputop call may have come from another thread
        with contextlib.suppress(Exception):
            self.thread.stacks.forward_codes = stacks.forward_codes(model)
        learn_compiling()  # before any hook is put in: a model compiled later must find them folded away
        self._compile_watch.install()
        found.update(facts.model_facts(model))
        found.update(facts.device_facts(found.get("device")))
        if found.get("data_parallel"):
            found.update(facts.data_parallel_facts(model))
        found.update(facts.identity())  # the process group may exist by now
        device = str(found.get("device", ""))
        on_cpu = device.startswith("cpu") or not device
        steps_so_far = self.thread.step_total + len(self.clock.marks)  # the reporter's count (racy only by a window)
        probes = self._model_probes.pick(model, device, steps_so_far=steps_so_far)
        # The backward's start, where a phase is timed on the CPU from it: the phases from hooks, DDP's logger (whose
        # backward starts at its forward's end).  On a GPU the phases are GPU time (CUDA events), which a gap on the
        # CPU is not; and elsewhere the engine runs the backward on a device thread of its own: no hook there.
        self.clock.marks_backward = on_cpu and (self.clock.times_phases or bool(found.get("ddp")))
        if side.flops is None:
            side.flops = FlopCounter()
        self._cpu_peak_wanted = on_cpu and found.get("cpu_peak_flops") is None
        self._sync_forwards_only = bool(found.get("ddp"))
        side.probes = (*(p for p in side.probes if p.name not in {q.name for q in probes}), *probes)
        with contextlib.suppress(Exception):
            import torch

            side.grad_enabled = torch.is_grad_enabled
        self._forward_handles = self._hook_forwards(model)
        side.facts_changed.set()

    def _hook_forwards(self, module: Any) -> list[Any]:
        """The forward hooks, on the watched model or on the wrapper ``torch.compile(model)`` made of it; their
        handles."""
        return hook_forward(module, self._on_forward, self._on_forward_done, self._hook_handles, with_kwargs=True)

    def _on_compiled(self, what: Any, result: Any) -> Any:
        """``torch.compile`` returned ``result`` for ``what`` (``compiled.CompileWatch``; training thread): where the
        watched model was compiled, its forward hooks move to where they run eagerly (``compiled.form_of``)."""
        form = form_of(self._model, what, result) if not self._forked else None
        if form is None:
            return result
        self._unhook_model()
        if form == WRAPPER:
            self._model_probes.timeline_handles = self._model_probes.hook_forwards(result)  # first, as on the model
            self._forward_handles = self._hook_forwards(result)
            return result
        pre: list[Callable[[Any, Any, Any], None]] = [self._on_forward]
        post: list[Callable[[Any, Any, Any], None]] = [self._on_forward_done]
        timeline = self._model_probes.timeline_hooks
        if timeline is not None:
            started, done = timeline
            pre.insert(0, lambda module, args, kwargs: started(module, args))
            post.append(done)
        return compiled_call(result, self._model, pre, post)

    def _unhook_model(self) -> None:
        for handle in (*self._forward_handles, *self._model_probes.timeline_handles):
            with contextlib.suppress(Exception):
                handle.remove()
        self._forward_handles, self._model_probes.timeline_handles = [], []

    def attach_loader(self, loader: Any) -> None:
        # Called each epoch (``gputop.track(loader)``): the hello is rebuilt only when the loader's settings changed.
        found, side = facts.loader_facts(loader), self.side
        if any(side.facts.get(key) != value for key, value in found.items()):
            side.facts.update(found)
            side.facts_changed.set()

    def mark_step(self) -> None:
        """``gputop.step()``: from now on only manual marks count as steps.

        The switch never counts one step twice.  A loop that calls
        ``optimizer.step()`` and then ``gputop.step()`` had its first step
        counted by the optimizer hook already: when the hook has marked and no
        batch was fetched since, the first manual mark closes that same step
        and only takes over.  (Called first, before the hook, it simply counts.)
        """
        if not self.manual_steps:
            self.manual_steps = True
            if self._hook_marked and self.clock.batches_since_mark == 0:
                return
        self._take_work()
        self.clock.mark_step()
        capture = self.side.capture
        if capture is not None:
            capture.on_step()

    def _install_step_hook(self) -> None:
        optim: Any = sys.modules.get("torch.optim.optimizer")
        if optim is None:
            try:
                optim = importlib.import_module("torch.optim.optimizer")
            except Exception:
                return
        try:
            self._hook_handles.append(optim.register_optimizer_step_post_hook(self._on_optimizer_step))
        except Exception:
            self.thread.announcer.failed_probes.add("optimizer_hook")
            return
        try:  # the optimizer's step as a phase of its own, from its pre-hook to the post-hook
            self._hook_handles.append(optim.register_optimizer_step_pre_hook(self._on_optimizer_start))
            self.clock.times_optimizer = True
        except Exception:
            self.thread.announcer.failed_probes.add("optimizer_pre_hook")

    def _take_work(self) -> None:
        """The step's FLOPs, queued just before its mark (the reporter thread pairs a window's marks with as many)."""
        side = self.side
        counter = side.flops
        if counter is not None:
            side.step_work.append(counter.take_step())

    def _end_counting(self) -> None:
        """The step's forwards and backwards are done: leave a counting, and on a CPU rank measure its matmul peak
        once, in the step the counting already slowed (it is no steady step's)."""
        side = self.side
        counter = side.flops
        if counter is None:
            return
        counting = counter.counting
        counter.end()
        if counting and self._cpu_peak_wanted:
            self._cpu_peak_wanted = False
            peak, cost_s, _ = measure_cpu_peak()
            if peak is not None:
                side.facts["cpu_peak_flops"], side.facts["cpu_peak_cost_s"] = peak, round(cost_s, 4)
                side.facts_changed.set()

    def _on_optimizer_start(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        if compiled.compiling() or self._forked:  # compiling: folded away where dynamo traces the step (compiled.py)
            return None
        clock = self.clock
        if clock._optimizer_depth == 0:
            self._end_counting()
        clock.optimizer_started()
        # Lightning (and LBFGS users) run forward and backward inside optimizer.step(closure): time the closure
        # apart, so the optimizer's phase is the update and the closure's time is the step's forward and backward.
        if clock._optimizer_depth != 1:
            return None
        return marking_closure(args, kwargs, clock.closure_started, self._on_closure_done)

    def _on_closure_done(self) -> None:
        """The step's closure returned: its forward and backward are done, and a counting ends with them, before
        the optimizer's own update runs (which is no work of the model's, and is where Lightning's FSDP2 steps
        its sharded parameters)."""
        self.clock.closure_done()
        self._end_counting()

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # With several optimizers (GANs, per-module ones) one iteration steps each
        # of them: the first optimizer seen stands for the training step.
        if compiled.compiling() or self._forked:
            return
        if self.manual_steps:
            self.clock.optimizer_done()
            return
        if self._primary_optimizer is None:
            self._primary_optimizer = id(optimizer)
        if id(optimizer) != self._primary_optimizer:
            self.clock.optimizer_done()
            return
        self._hook_marked = True
        self._take_work()
        self.clock.optimizer_done(True)  # and the step mark, with the clock read that ends the optimizer's step
        capture = self.side.capture
        if capture is not None:
            capture.on_step()

    def _on_forward_done(self, module: Any, args: Any, output: Any) -> None:
        # The end of a training forward: the rank is ready for backward, and so for the gradient exchange.
        if compiled.compiling():  # folded away where dynamo traces the model (compiled.py)
            return
        grad_enabled = self.side.grad_enabled
        if grad_enabled is None or grad_enabled():
            clock = self.clock
            clock.forward_end_s = now = time.perf_counter()
            clock.forward_length_s = now - clock.forward_start_s
            if clock.times_phases:
                clock.forward_done(now)
            if clock.marks_backward and not self._forked:
                self._hook_backward(module, output)
            counter = self.side.flops
            if counter is not None and not self._forked:
                counter.forward_done()  # what runs next outside a backward is no model FLOPs

    def _hook_backward(self, module: Any, output: Any) -> None:
        """Mark when this training forward's backward begins: a pre-hook on the autograd node of the model's output.

        A pre-hook on that node (``Node.register_prehook``, torch 2.0 on), not a tensor hook: the output tensor is
        left as it was (no ``_backward_hooks`` on the user's tensor; an in-place op on the output later leaves the
        node where it is and the gradient still reaches it), and it costs less to register.  It returns None, so the
        gradient passes unchanged; the node, and the hook with it, go when the graph is freed.
        """
        if self._sync_forwards_only and not getattr(module, "require_backward_grad_sync", True):
            return  # under DDP's no_sync(): DDP times no backward of this micro-batch, there is no gap to take out
        node = output_node(output)
        if node is None:
            return  # no gradient will reach the output (a leaf, no tensor): its backward stays timed as before
        try:
            node.register_prehook(self._on_backward_start)
        except Exception:
            return
        self.clock.backward_pending = True

    def _on_backward_start(self, grad_outputs: Any) -> None:
        """The autograd pre-hook: the gradient reached the watched model's output, its backward begins.  On the CPU
        the engine runs it on the thread that called backward(), the training thread.  Nothing it raises reaches
        the backward: a failure turns the mark off, and backwards are timed from the forward's end, as before."""
        if compiled.compiling():  # compiled autograd traces the backward's hooks: folded away there
            return
        clock = self.clock
        try:
            clock.backward_started(time.perf_counter())
        except Exception:
            clock.marks_backward = clock.backward_pending = False

    def _on_forward(self, module: Any, args: Any, kwargs: Any = None) -> None:
        if compiled.compiling():  # folded away where dynamo traces the model (compiled.py)
            return
        # Autocast is thread-local and only visible around forward: look now and then.
        clock, side = self.clock, self.side
        clock.forwards += 1
        grad_enabled = side.grad_enabled
        if grad_enabled is not None and grad_enabled():  # evaluation forwards are no micro-batches
            side.train_forwards += 1
            clock.forward_numel = input_numel(args, kwargs)
            clock.forward_start_s = now = time.perf_counter()
            if clock.times_phases:
                clock.forward_started(now)
            counter = side.flops
            if counter is not None and not self._forked:
                counter.on_forward(shape_key(args, kwargs))
        if clock.forwards % 50 != 1:
            return
        try:
            import torch

            device_type = "cuda" if str(side.facts.get("device", "")).startswith("cuda") else "cpu"
            enabled = bool(torch.is_autocast_enabled(device_type))
        except Exception:
            return
        if side.facts.get("autocast") != enabled:
            side.facts["autocast"] = enabled
            side.facts_changed.set()

    # -- process exit ---------------------------------------------------------------

    def shutdown(self) -> None:
        """Send the last window and a bye, waiting at most EXIT_FLUSH_S.  Idempotent."""
        if os.getpid() != self.pid or self.thread.stopping:
            return
        self.thread.stop(EXIT_FLUSH_S + 0.5)  # a SIGTERM meanwhile waits for this bye (_bye_on_sigterm)
        self.sigterm.uninstall()  # from here SIGTERM ends the process at once, even in the interpreter's teardown
        self.side.tap.forget_groups()
        for handle in self._hook_handles:
            with contextlib.suppress(Exception):
                handle.remove()

    def _bye_on_sigterm(self, bound_s: float) -> None:
        """SIGTERM's bye (``sigterm.SigtermBye``), from whichever thread heard it first: the last window and the
        bye, and the wait for them, all within ``bound_s``; the process dies of the signal next.  Where the
        reporter thread cannot say it in its share of the bound, the bye alone goes on a connection of its own."""
        if os.getpid() != self.pid:
            return
        if self.thread.stopping:  # the exit's bye is on its way (a launcher's SIGTERM after a peer died): let it leave
            self.thread.join(bound_s)
            return
        own_s = bound_s * BYE_OWN_SHARE
        self.thread.stop(own_s, flush_s=max(own_s - EXIT_LINGER_MIN_S, 0.0))
        if self.thread.alive:  # stuck short of its bye (in a probe): the bye on a connection of its own
            self.thread.bye_apart(bound_s - own_s)

    # -- the trainer's logger ------------------------------------------------------------

    def figures(self) -> dict[str, float]:
        """This rank's recent step breakdown and its run's findings, as logger keys; any thread."""
        return self.thread.trainer_log.figures(self.thread.announcer.hello().rank)

    def log_to(self, writer: Any, every_s: float) -> None:
        """Write ``figures()`` to a TensorBoard-like writer (``add_scalar``) from this thread every ``every_s``."""
        self.thread.trainer_log.add_writer(writer, every_s)
