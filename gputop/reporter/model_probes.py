"""The probes a watched model offers, picked on the training thread when ``gputop.watch(model)`` is called.

DDP's logger where the model is DDP; the CUDA memory and the GPU step events of the device its parameters
are on (never the thread's current device: a script that placed the model without ``torch.cuda.set_device``
still has device 0 current); the phases on the GPU clock (``CudaTimeline``) for a model on one GPU off DDP,
with the forward and optimizer hooks they need; and the collective tap in a distributed job.  A probe that
cannot measure says why (``not_measured``); one that fails is named once through the announcer.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

from gputop import settings
from gputop.reporter import compiled
from gputop.reporter.announcer import Announcer
from gputop.reporter.cuda_switches import nccl_timing_on
from gputop.reporter.cuda_timeline import CudaTimeline
from gputop.reporter.probes import Probe
from gputop.reporter.probes.collectives import CollectiveProbe
from gputop.reporter.probes.cuda_memory import CudaMemoryProbe
from gputop.reporter.probes.cuda_phases import CudaPhaseProbe
from gputop.reporter.probes.ddp import DdpProbe
from gputop.reporter.probes.gpu_steps import GpuStepProbe
from gputop.reporter.rank_cuda import RankCuda, model_cuda_index
from gputop.reporter.training_side import TrainingSide


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


def hook_forward(
    module: Any, pre: Callable[..., Any], post: Callable[..., Any], handles: list[Any], **pre_options: bool
) -> list[Any]:
    """``pre`` and ``post`` as ``module``'s forward pre- and post-hook, either left out where torch refuses it: their
    handles, which ``handles`` (the reporter's, removed at shutdown) holds too."""
    mine = []
    with contextlib.suppress(Exception):
        mine.append(module.register_forward_pre_hook(pre, **pre_options))
    with contextlib.suppress(Exception):
        mine.append(module.register_forward_hook(post))
    handles += mine
    return mine


class ModelProbes:
    """Picks a watched model's probes and installs the hooks they need; keeps its CUDA timeline, if any.

    ``hook_handles``: the reporter's list of what it registered on torch, removed at shutdown.  ``cuda``:
    ``torch.cuda`` (None: looked up when a model on CUDA is watched) or a stand-in for tests.
    """

    def __init__(self, side: TrainingSide, announcer: Announcer, hook_handles: list[Any], cuda: Any = None) -> None:
        self._side = side
        self._announcer = announcer
        self._hook_handles = hook_handles
        self._cuda = cuda
        # The phases on the GPU clock, for a model on one GPU off DDP (the CPU path's hooks would time launches).
        self.timeline: CudaTimeline | None = None
        self._timeline_optimizer_hooks = False  # its global optimizer hooks, installed once
        # The timeline's forward hooks (pre, post), for the watched model's compiled forms too (``hook_forwards``).
        self.timeline_hooks: tuple[Callable[[Any, Any], None], Callable[[Any, Any, Any], None]] | None = None
        self.timeline_handles: list[Any] = []  # those hooks' handles on the watched model
        self.forked = False  # set in a forked child (a DataLoader worker inherits the hooks): they do nothing

    def pick(self, model: Any, device: str, *, steps_so_far: int) -> list[Probe]:
        """The probes this model offers on ``device`` (the facts' ``"cuda:0"``, ``"cpu"`` or ""), its hooks
        installed; ``steps_so_far``: the steps reported and marked, the first the timeline numbers after."""
        facts = self._side.facts
        probes: list[Probe] = []
        if facts.get("ddp"):
            ddp = DdpProbe(model, on_cpu=device.startswith("cpu") or not device, clock=self._side.clock)
            if ddp.rate_error is not None:
                self._announcer.failed_probes.add("ddp_sample_rate")
            probes.append(ddp)
        if device.startswith("cuda"):
            with contextlib.suppress(Exception):
                index = int(device.partition(":")[2])
                probes.append(CudaMemoryProbe(self.rank_cuda(index), facts.get("device_total_bytes")))
        gpu_steps = self._gpu_step_probe(model)
        if gpu_steps is not None:
            probes.append(gpu_steps)
        phases = self._cuda_phase_probe(model, device, gpu_steps, first_step=steps_so_far + 1)
        if phases is not None:
            probes.append(phases)
        probes += self._collective_probe(model, device)
        if phases is not None and probes[-1:] and isinstance(probes[-1], CollectiveProbe):
            phases.name_group = probes[-1].group_name  # its rows under the names the collectives have
        return probes

    def rank_cuda(self, index: int) -> RankCuda:
        devices = self._side.cuda_devices
        device = devices.get(index)
        if device is None:
            device = devices[index] = RankCuda(index, self._cuda)
        return device

    def _gpu_step_probe(self, model: Any) -> GpuStepProbe | None:
        """GPU step time on the model's device, or a probe saying why not; None for a CPU run.

        Step events go on the current stream of the device the parameters are
        on, never on the thread's current device: a script that placed the
        model without ``torch.cuda.set_device`` still has device 0 current.
        """
        clock = self._side.clock
        clock.gpu_steps = None  # a model watched before may have been elsewhere
        try:
            index, why_not = model_cuda_index(model, cuda_in_use=self._cuda_in_use())
        except Exception:
            return None  # no parameters to read: model_facts found no device either
        if index is None:
            return None if why_not is None else GpuStepProbe(None, not_measured=why_not)
        if not settings.CUDA_EVENTS.value():
            return GpuStepProbe(None, not_measured=f"CUDA events are off ({settings.CUDA_EVENTS.env}=0)")
        try:
            device = self.rank_cuda(index)
        except Exception as exc:
            return GpuStepProbe(None, not_measured=f"torch.cuda is not usable here ({type(exc).__name__})")
        clock.gpu_steps = device
        return GpuStepProbe(device)

    def _cuda_in_use(self) -> bool:
        """Whether this process has started CUDA (a flag torch keeps; asking it starts nothing)."""
        cuda = self._cuda
        if cuda is None:
            cuda = getattr(sys.modules.get("torch"), "cuda", None)
        try:
            return bool(cuda is not None and cuda.is_initialized())
        except Exception:
            return False

    def _cuda_phase_probe(
        self, model: Any, device: str, gpu_steps: GpuStepProbe | None, *, first_step: int
    ) -> CudaPhaseProbe | None:
        """The phases on the GPU clock for a model on CUDA off DDP (whose logger times them), or why not; None
        for a CPU run or DDP.

        The timeline stands in for the step events as the clock's ``gpu_steps`` (it records them too), so the
        step mark asks nothing it did not ask before; the forward hooks and the optimizer's hooks it needs
        are installed here, on CUDA only: a CPU run's training thread runs none of this.
        """
        side = self._side
        if self.timeline is not None:  # a model watched before: its timeline records nothing more
            self.timeline.close()
            self.timeline = side.tap.timeline = None
            self.timeline_hooks, self.timeline_handles = None, []
        if side.facts.get("ddp") or not device.startswith("cuda"):
            return None
        rank_cuda = side.clock.gpu_steps
        if not isinstance(rank_cuda, RankCuda):
            why = gpu_steps.not_measured if gpu_steps is not None else None
            why = why or "the model's GPU is not known"
            return CudaPhaseProbe(None, not_measured=f"{why}; forward, backward and exposed communication need them")
        timeline = CudaTimeline(rank_cuda, first_step=first_step, nccl_timing=nccl_timing_on())
        self.timeline = side.tap.timeline = timeline
        side.clock.gpu_steps = timeline
        self._hook_timeline(model, timeline)
        return CudaPhaseProbe(timeline)

    def _hook_timeline(self, model: Any, timeline: CudaTimeline) -> None:
        """The model's forward hooks for the timeline (first among the pre-hooks: FSDP2's root all-gather wait is
        then inside the forward it serves), and global optimizer hooks that mark its start and end."""
        side = self._side
        grad_enabled = side.grad_enabled
        if grad_enabled is None:
            with contextlib.suppress(Exception):
                import torch

                grad_enabled = side.grad_enabled = torch.is_grad_enabled

        def forward_started(module: Any, args: Any) -> None:
            if compiled.compiling():  # folded away where dynamo traces the model (compiled.py)
                return
            if grad_enabled is None or grad_enabled():
                timeline.forward_started()

        def forward_done(module: Any, args: Any, output: Any) -> None:
            if compiled.compiling():
                return
            if grad_enabled is None or grad_enabled():
                timeline.forward_done()

        self.timeline_hooks = (forward_started, forward_done)
        self.timeline_handles = self.hook_forwards(model)
        if self._timeline_optimizer_hooks:
            return
        optim: Any = sys.modules.get("torch.optim.optimizer")
        try:
            self._hook_handles.append(optim.register_optimizer_step_pre_hook(self._on_timeline_optimizer_start))
            self._hook_handles.append(optim.register_optimizer_step_post_hook(self._on_timeline_optimizer_done))
            self._timeline_optimizer_hooks = True
        except Exception:
            self._announcer.failed_probes.add("cuda_optimizer_hooks")

    def hook_forwards(self, module: Any) -> list[Any]:
        """Put the timeline's forward hooks on ``module``: the watched model, or the wrapper compiling it made;
        their handles."""
        if self.timeline_hooks is None:
            return []
        forward_started, forward_done = self.timeline_hooks
        return hook_forward(module, forward_started, forward_done, self._hook_handles, prepend=True)

    def _on_timeline_optimizer_start(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        timeline = self.timeline
        if compiled.compiling() or timeline is None or self.forked:
            return None
        timeline.optimizer_started()
        # The closure (Lightning's forward and backward inside optimizer.step(closure)) is not the optimizer's.
        if timeline.optimizer_depth != 1:
            return None
        return marking_closure(args, kwargs, timeline.closure_started, timeline.closure_done)

    def _on_timeline_optimizer_done(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if compiled.compiling():
            return
        timeline = self.timeline
        if timeline is not None and not self.forked:
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
        side = self._side
        try:
            side.tap.install()
        except Exception as exc:
            side.tap.uninstall()
            self._announcer.report_error("collectives", exc)
            return []
        side.clock.times_phases = not side.facts.get("ddp") and not device.startswith("cuda")
        probe = CollectiveProbe(side.tap)
        with contextlib.suppress(Exception):
            probe.learn_meshes(model)
        if side.facts.get("ddp"):  # the group DDP's own all-reduce runs on, for its row among the collectives
            with contextlib.suppress(Exception):
                side.facts["ddp_group"] = probe.group_name(model.process_group)
                side.facts["ddp_group_ranks"] = probe.group_size(model.process_group)
        return [probe]
