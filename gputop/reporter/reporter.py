"""The reporter, one per training process: what the training thread calls, and the hooks it installs.

``gputop.watch()`` creates and starts it.  On the training thread it reads the
process's and the model's facts, installs the optimizer's step hooks and the
model's forward pre-hook, picks the probes the model offers (DDP timings, CUDA
memory, GPU step events) and marks steps: a step mark, from the optimizer's
post-hook or ``gputop.step()``, is ``clock.StepClock.mark_step`` and nothing
more of substance (docs/architecture.md, "Training thread: a deque append,
nothing else").  Everything else happens on the reporter thread, whose half of
the class is ``reporter_thread.ReporterThread``.
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
from collections import deque
from collections.abc import Callable
from typing import Any

from gputop import settings
from gputop.address import Address
from gputop.reporter import facts, stacks
from gputop.reporter.capture import ProfilerCapture
from gputop.reporter.clock import MAX_PENDING_STEPS, StepClock, input_numel, output_node
from gputop.reporter.collectives import CollectiveTap
from gputop.reporter.cuda_timeline import CudaTimeline, nccl_timing_on
from gputop.reporter.device_peak import measure_cpu_peak
from gputop.reporter.flops import FlopCounter, shape_key
from gputop.reporter.probes import Probe
from gputop.reporter.probes.collectives import CollectiveProbe
from gputop.reporter.probes.compile import CompileProbe
from gputop.reporter.probes.cuda_memory import CudaMemoryProbe
from gputop.reporter.probes.cuda_phases import CudaPhaseProbe
from gputop.reporter.probes.ddp import DdpProbe
from gputop.reporter.probes.gpu_steps import GpuStepProbe
from gputop.reporter.rank_cuda import RankCuda, model_cuda_index
from gputop.reporter.reporter_thread import EXIT_FLUSH_S, ReporterThread

DEFAULT_WINDOW_S = settings.WINDOW_S.default


def marking_closure(
    args: Any, kwargs: Any, started: Callable[[], None], done: Callable[[], None]
) -> tuple[Any, Any] | None:
    """An optimizer step pre-hook's answer that runs ``started`` and ``done`` around the step's closure, if it has
    one (``optimizer.step(closure)``: Lightning's forward and backward, LBFGS); None: leave the call as it is.

    ``args`` as torch hands them to a step pre-hook: the optimizer itself first, then step()'s own.
    """
    in_kwargs = bool(kwargs) and "closure" in kwargs
    closure = kwargs["closure"] if in_kwargs else (args[1] if len(args) > 1 else None)
    if not callable(closure):
        return None

    def marked_closure(*closure_args: Any, **closure_kwargs: Any) -> Any:
        started()
        try:
            return closure(*closure_args, **closure_kwargs)
        finally:
            done()

    if in_kwargs:
        return tuple(args), {**kwargs, "closure": marked_closure}
    return (args[0], marked_closure, *args[2:]), kwargs


def _forget_in_forked_children(reporter: Reporter) -> None:
    """Set ``reporter._forked`` in every child forked from here on (weakly: a reporter that is gone is left alone)."""
    ref = weakref.ref(reporter)

    def forked() -> None:
        found = ref()
        if found is not None:
            found._forked = True

    with contextlib.suppress(Exception):
        os.register_at_fork(after_in_child=forked)


class Reporter(ReporterThread):
    """One per process; ``gputop.watch()`` creates and starts it."""

    def __init__(self, address: Address, *, window_s: float = DEFAULT_WINDOW_S, cuda: Any = None) -> None:
        """``cuda``: ``torch.cuda`` (None: imported when a model on CUDA is watched) or a stand-in for tests."""
        self.window_s = window_s
        self.clock = StepClock()
        self.pid = os.getpid()
        # Set in a forked child (a DataLoader worker inherits the hooks): the hooks then do nothing.  A flag, not
        # ``os.getpid() != self.pid`` per call: getpid is a system call, ~0.1-0.4 µs twice a step on a VM.
        self._forked = False
        _forget_in_forked_children(self)
        self.started_t = time.time()
        self._facts: dict[str, Any] = {}
        self._facts_changed = threading.Event()
        self._model: Any = None
        # Read by the reporter thread, replaced whole (never mutated) by the training thread.  torch.compile's
        # from the start: it reads nothing until the script has compiled something, model watched or not.
        self._probes: tuple[Probe, ...] = (CompileProbe(),)
        self._train_tid = threading.get_native_id()  # the thread that calls gputop: the training thread
        self._train_ident = threading.get_ident()  # the same thread, as sys._current_frames() names it
        self._hook_handles: list[Any] = []
        self._primary_optimizer: int | None = None
        self.manual_steps = False
        self._hook_marked = False  # the optimizer hook has marked a step (before any manual mark)
        self._cuda = cuda
        # Every CUDA device a watched model was on, kept until the reporter thread drops their events at exit.
        self._cuda_devices: dict[int, RankCuda] = {}
        self._train_forwards = 0  # forwards with autograd on: micro-batches, counted on the training thread
        self._grad_enabled: Callable[[], bool] | None = None  # torch.is_grad_enabled, once a model is watched
        # Set by the reporter thread when the dashboard asks for a profile; the training thread's step marks drive it.
        self._capture: ProfilerCapture | None = None
        # The collectives torch.distributed's Python API issues, timed once a model is watched in a process group.
        self.tap = CollectiveTap(self.clock)
        # The phases on the GPU clock, for a model on one GPU off DDP (the CPU path's hooks would time launches).
        self._timeline: CudaTimeline | None = None
        self._timeline_optimizer_hooks = False  # its global optimizer hooks, installed once
        # Under DDP only the forwards that synchronise gradients have their backward's start marked: DDP's logger
        # times no other (``no_sync()`` micro-batches), so no other's gap is taken out of its backward.
        self._sync_forwards_only = False
        # The work each step does (issue #46): FLOPs counted once per input shape, once a model is watched; each
        # step's figure is queued at its mark for the reporter thread (``ReporterThread.step_work``).
        self._flops: FlopCounter | None = None
        self.step_work: deque[tuple[int | None, bool]] = deque(maxlen=MAX_PENDING_STEPS)
        self._cpu_peak_wanted = False  # a CPU rank measures its matmul peak once, in a step the counter slows anyway
        super().__init__(address)  # the reporter thread's half: its sender, windows, stacks, node sampler

    # -- training thread ------------------------------------------------------------

    def start(self) -> None:
        self._facts.update(facts.identity())
        self._facts.update(facts.torch_facts())
        self._refresh_hello()
        self._install_step_hook()
        self.ending.install()
        atexit.register(self.shutdown)
        try:  # multiprocessing children (mp.spawn) skip atexit but run these finalizers
            import multiprocessing.util

            multiprocessing.util.Finalize(self, self.shutdown, exitpriority=100)
        except Exception:
            pass
        self._thread.start()

    def attach_model(self, model: Any) -> None:
        """Read the model's facts and hook what it offers (DDP stats, autocast, CUDA events)."""
        if model is None or model is self._model:
            return
        self._model = model
        self._train_tid = threading.get_native_id()
        self._train_ident = threading.get_ident()
        with contextlib.suppress(Exception):
            self._stacks.forward_codes = stacks.forward_codes(model)
        self._facts.update(facts.model_facts(model))
        self._facts.update(facts.device_facts(self._facts.get("device")))
        if self._facts.get("data_parallel"):
            self._facts.update(facts.data_parallel_facts(model))
        self._facts.update(facts.identity())  # the process group may exist by now
        device = str(self._facts.get("device", ""))
        probes: list[Probe] = []
        on_cpu = device.startswith("cpu") or not device
        if self._facts.get("ddp"):
            ddp = DdpProbe(model, on_cpu=on_cpu, clock=self.clock)
            if ddp.rate_error is not None:
                self._failed_probes.add("ddp_sample_rate")
            probes.append(ddp)
        if device.startswith("cuda"):
            with contextlib.suppress(Exception):
                index = int(device.partition(":")[2])
                probes.append(CudaMemoryProbe(self._rank_cuda(index), self._facts.get("device_total_bytes")))
        gpu_steps = self._gpu_step_probe(model)
        if gpu_steps is not None:
            probes.append(gpu_steps)
        phases = self._cuda_phase_probe(model, device, gpu_steps)
        if phases is not None:
            probes.append(phases)
        probes += self._collective_probe(model, device)
        # The backward's start, where a phase is timed on the CPU from it: the phases from hooks, DDP's logger (whose
        # backward starts at its forward's end).  On a GPU the phases are GPU time (CUDA events), which a gap on the
        # CPU is not; and elsewhere the engine runs the backward on a device thread of its own: no hook there.
        self.clock.marks_backward = on_cpu and (self.clock.times_phases or bool(self._facts.get("ddp")))
        if self._flops is None:
            self._flops = FlopCounter()
        self._cpu_peak_wanted = on_cpu and self._facts.get("cpu_peak_flops") is None
        self._sync_forwards_only = bool(self._facts.get("ddp"))
        if phases is not None and probes[-1:] and isinstance(probes[-1], CollectiveProbe):
            phases.name_group = probes[-1].group_name  # its rows under the names the collectives have
        self._probes = (*(p for p in self._probes if p.name not in {q.name for q in probes}), *probes)
        with contextlib.suppress(Exception):
            import torch

            self._grad_enabled = torch.is_grad_enabled
        with contextlib.suppress(Exception):
            self._hook_handles.append(model.register_forward_pre_hook(self._on_forward, with_kwargs=True))
        with contextlib.suppress(Exception):
            self._hook_handles.append(model.register_forward_hook(self._on_forward_done))
        self._facts_changed.set()

    def _gpu_step_probe(self, model: Any) -> GpuStepProbe | None:
        """GPU step time on the model's device, or a probe saying why not; None for a CPU run.

        Step events go on the current stream of the device the parameters are
        on, never on the thread's current device: a script that placed the
        model without ``torch.cuda.set_device`` still has device 0 current.
        """
        self.clock.gpu_steps = None  # a model watched before may have been elsewhere
        try:
            index, why_not = model_cuda_index(model, cuda_in_use=self._cuda_in_use())
        except Exception:
            return None  # no parameters to read: model_facts found no device either
        if index is None:
            return None if why_not is None else GpuStepProbe(None, not_measured=why_not)
        if not settings.CUDA_EVENTS.value():
            return GpuStepProbe(None, not_measured=f"CUDA events are off ({settings.CUDA_EVENTS.env}=0)")
        try:
            device = self._rank_cuda(index)
        except Exception as exc:
            return GpuStepProbe(None, not_measured=f"torch.cuda is not usable here ({type(exc).__name__})")
        self.clock.gpu_steps = device
        return GpuStepProbe(device)

    def _cuda_phase_probe(self, model: Any, device: str, gpu_steps: GpuStepProbe | None) -> CudaPhaseProbe | None:
        """The phases on the GPU clock for a model on CUDA off DDP (whose logger times them), or why not; None
        for a CPU run or DDP.

        The timeline stands in for the step events as the clock's ``gpu_steps`` (it records them too), so the
        step mark asks nothing it did not ask before; the forward hooks and the optimizer's hooks it needs
        are installed here, on CUDA only: a CPU run's training thread runs none of this.
        """
        if self._timeline is not None:  # a model watched before: its timeline records nothing more
            self._timeline.close()
            self._timeline = self.tap.timeline = None
        if self._facts.get("ddp") or not device.startswith("cuda"):
            return None
        rank_cuda = self.clock.gpu_steps
        if not isinstance(rank_cuda, RankCuda):
            why = gpu_steps.not_measured if gpu_steps is not None else None
            why = why or "the model's GPU is not known"
            return CudaPhaseProbe(None, not_measured=f"{why}; forward, backward and exposed communication need them")
        first_step = self._step_total + len(self.clock.marks) + 1  # the reporter's count (racy only by a window)
        timeline = CudaTimeline(rank_cuda, first_step=first_step, nccl_timing=nccl_timing_on())
        self._timeline = self.tap.timeline = timeline
        self.clock.gpu_steps = timeline
        self._hook_timeline(model, timeline)
        return CudaPhaseProbe(timeline)

    def _hook_timeline(self, model: Any, timeline: CudaTimeline) -> None:
        """The model's forward hooks for the timeline (first among the pre-hooks: FSDP2's root all-gather wait is
        then inside the forward it serves), and global optimizer hooks that mark its start and end."""
        grad_enabled = self._grad_enabled
        if grad_enabled is None:
            with contextlib.suppress(Exception):
                import torch

                grad_enabled = self._grad_enabled = torch.is_grad_enabled

        def forward_started(module: Any, args: Any) -> None:
            if grad_enabled is None or grad_enabled():
                timeline.forward_started()

        def forward_done(module: Any, args: Any, output: Any) -> None:
            if grad_enabled is None or grad_enabled():
                timeline.forward_done()

        with contextlib.suppress(Exception):
            self._hook_handles.append(model.register_forward_pre_hook(forward_started, prepend=True))
        with contextlib.suppress(Exception):
            self._hook_handles.append(model.register_forward_hook(forward_done))
        if self._timeline_optimizer_hooks:
            return
        optim: Any = sys.modules.get("torch.optim.optimizer")
        try:
            self._hook_handles.append(optim.register_optimizer_step_pre_hook(self._on_timeline_optimizer_start))
            self._hook_handles.append(optim.register_optimizer_step_post_hook(self._on_timeline_optimizer_done))
            self._timeline_optimizer_hooks = True
        except Exception:
            self._failed_probes.add("cuda_optimizer_hooks")

    def _on_timeline_optimizer_start(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        timeline = self._timeline
        if timeline is None or self._forked:
            return None
        timeline.optimizer_started()
        # The closure (Lightning's forward and backward inside optimizer.step(closure)) is not the optimizer's.
        if timeline.optimizer_depth != 1:
            return None
        return marking_closure(args, kwargs, timeline.closure_started, timeline.closure_done)

    def _on_timeline_optimizer_done(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        timeline = self._timeline
        if timeline is not None and not self._forked:
            timeline.optimizer_done()

    def _collective_probe(self, model: Any, device: str) -> list[Probe]:
        """Time the collectives of a distributed job, and the phases from hooks where DDP's logger does not.

        The phases from hooks are CPU time: on CUDA they would time kernel launches, not the GPU's work, so
        there the timeline (``_cuda_phase_probe``) times them on the GPU clock instead, and the tap's CUDA
        wrappers time the collectives with its events.
        """
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is None or not dist.is_available() or not dist.is_initialized():
                return []
        except Exception:
            return []
        try:
            self.tap.install()
        except Exception as exc:
            self.tap.uninstall()
            self._failed_probes.add("collectives")
            self._report_error("collectives", exc)
            return []
        self.clock.times_phases = not self._facts.get("ddp") and not device.startswith("cuda")
        probe = CollectiveProbe(self.tap)
        with contextlib.suppress(Exception):
            probe.learn_meshes(model)
        if self._facts.get("ddp"):  # the group DDP's own all-reduce runs on, for its row among the collectives
            with contextlib.suppress(Exception):
                self._facts["ddp_group"] = probe.group_name(model.process_group)
        return [probe]

    def _rank_cuda(self, index: int) -> RankCuda:
        device = self._cuda_devices.get(index)
        if device is None:
            device = self._cuda_devices[index] = RankCuda(index, self._cuda)
        return device

    def _cuda_in_use(self) -> bool:
        """Whether this process has started CUDA (a flag torch keeps; asking it starts nothing)."""
        cuda = self._cuda
        if cuda is None:
            cuda = getattr(sys.modules.get("torch"), "cuda", None)
        try:
            return bool(cuda is not None and cuda.is_initialized())
        except Exception:
            return False

    def attach_loader(self, loader: Any) -> None:
        # Called each epoch (``gputop.track(loader)``): the hello is rebuilt only when the loader's settings changed.
        found = facts.loader_facts(loader)
        if any(self._facts.get(key) != value for key, value in found.items()):
            self._facts.update(found)
            self._facts_changed.set()

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
        capture = self._capture
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
            self._failed_probes.add("optimizer_hook")
            return
        try:  # the optimizer's step as a phase of its own, from its pre-hook to the post-hook
            self._hook_handles.append(optim.register_optimizer_step_pre_hook(self._on_optimizer_start))
            self.clock.times_optimizer = True
        except Exception:
            self._failed_probes.add("optimizer_pre_hook")

    def _take_work(self) -> None:
        """The step's FLOPs, queued just before its mark (the reporter thread pairs a window's marks with as many)."""
        counter = self._flops
        if counter is not None:
            self.step_work.append(counter.take_step())

    def _end_counting(self) -> None:
        """The step's forwards and backwards are done: leave a counting, and on a CPU rank measure its matmul peak
        once, in the step the counting already slowed (it is no steady step's)."""
        counter = self._flops
        if counter is None:
            return
        counting = counter.counting
        counter.end()
        if counting and self._cpu_peak_wanted:
            self._cpu_peak_wanted = False
            peak, cost_s, _ = measure_cpu_peak()
            if peak is not None:
                self._facts["cpu_peak_flops"], self._facts["cpu_peak_cost_s"] = peak, round(cost_s, 4)
                self._facts_changed.set()

    def _on_optimizer_start(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        if self._forked:
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
        if self._forked:
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
        capture = self._capture
        if capture is not None:
            capture.on_step()

    def _on_forward_done(self, module: Any, args: Any, output: Any) -> None:
        # The end of a training forward: the rank is ready for backward, and so for the gradient exchange.
        grad_enabled = self._grad_enabled
        if grad_enabled is None or grad_enabled():
            clock = self.clock
            clock.forward_end_s = now = time.perf_counter()
            clock.forward_length_s = now - clock.forward_start_s
            if clock.times_phases:
                clock.forward_done(now)
            if clock.marks_backward and not self._forked:
                self._hook_backward(module, output)

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
        clock = self.clock
        try:
            clock.backward_started(time.perf_counter())
        except Exception:
            clock.marks_backward = clock.backward_pending = False

    def _on_forward(self, module: Any, args: Any, kwargs: Any = None) -> None:
        # Autocast is thread-local and only visible around forward: look now and then.
        clock = self.clock
        clock.forwards += 1
        grad_enabled = self._grad_enabled
        if grad_enabled is not None and grad_enabled():  # evaluation forwards are no micro-batches
            self._train_forwards += 1
            clock.forward_numel = input_numel(args, kwargs)
            clock.forward_start_s = now = time.perf_counter()
            if clock.times_phases:
                clock.forward_started(now)
            counter = self._flops
            if counter is not None and not self._forked:
                counter.on_forward(shape_key(args, kwargs))
        if clock.forwards % 50 != 1:
            return
        try:
            import torch

            device_type = "cuda" if str(self._facts.get("device", "")).startswith("cuda") else "cpu"
            enabled = bool(torch.is_autocast_enabled(device_type))
        except Exception:
            return
        if self._facts.get("autocast") != enabled:
            self._facts["autocast"] = enabled
            self._facts_changed.set()

    # -- process exit ---------------------------------------------------------------

    def shutdown(self) -> None:
        """Send the last window and a bye, waiting at most EXIT_FLUSH_S.  Idempotent."""
        if os.getpid() != self.pid or self._stop.is_set():
            return
        self._stop.set()
        self._wake.release()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(EXIT_FLUSH_S + 0.5)
        for handle in self._hook_handles:
            with contextlib.suppress(Exception):
                handle.remove()

    # -- the trainer's logger ------------------------------------------------------------

    def figures(self) -> dict[str, float]:
        """This rank's recent step breakdown and its run's findings, as logger keys; any thread."""
        return self.trainer_log.figures(self._hello_or_new().rank)

    def log_to(self, writer: Any, every_s: float) -> None:
        """Write ``figures()`` to a TensorBoard-like writer (``add_scalar``) from this thread every ``every_s``."""
        self.trainer_log.add_writer(writer, every_s)
