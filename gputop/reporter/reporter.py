"""The reporter: a daemon thread in each training process that turns step marks into windows.

Every ``window_s`` it drains the training thread's step marks, asks each probe
(``gputop.reporter.probes``: DDP timings, CUDA memory, GPU step events, the
process's CPU) for its fields, builds one ``Window`` and hands it to the
sender.  It catches everything: a failing probe turns its columns to N/A and is
reported once as an event.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import sys
import threading
import time
from typing import Any

import msgspec

from gputop import __version__
from gputop.address import Address
from gputop.procfs import name_this_thread
from gputop.protocol import (
    Accepts,
    Bye,
    CaptureRequest,
    CaptureResult,
    Collective,
    Event,
    FindingsNotice,
    Hello,
    ProtocolError,
    Window,
    decode_command,
    encode,
)
from gputop.reporter import facts, flight_recorder, node_sampler, stacks
from gputop.reporter.capture import ProfilerCapture, torch_profiler_available
from gputop.reporter.clock import StepClock, calibrate
from gputop.reporter.probes import Probe
from gputop.reporter.probes.cuda_memory import CudaMemoryProbe
from gputop.reporter.probes.ddp import DdpProbe
from gputop.reporter.probes.gpu_steps import GpuStepProbe
from gputop.reporter.probes.process import ProcessProbe
from gputop.reporter.rank_cuda import RankCuda, model_cuda_index
from gputop.reporter.sender import Sender
from gputop.reporter.trainer_figures import TrainerLog
from gputop.reporter.window import step_fields

DEFAULT_WINDOW_S = 0.5
BACKLOG_S = 600.0  # ten minutes of windows wait for a dashboard that starts late
TICK_S = 0.25  # how often the thread wakes to connect and flush between windows: twice per window
EXIT_FLUSH_S = 1.0  # the most process exit waits for the last window to leave
EXIT_LINGER_MIN_S = 0.2  # and then for the dashboard to take it, however long the flush took
# Where the training thread was goes up once a second (stacks.SEND_EVERY_S): a 10-s span holds ten, a hang's
# newest place is at most a second old, and a collector of 1,024 ranks reads 1,024 more frames a second, not 2,048.
STACKS_EVERY_S = stacks.SEND_EVERY_S


class Reporter:
    """One per process; ``gputop.watch()`` creates and starts it."""

    def __init__(self, address: Address, *, window_s: float = DEFAULT_WINDOW_S, cuda: Any = None) -> None:
        """``cuda``: ``torch.cuda`` (None: imported when a model on CUDA is watched) or a stand-in for tests."""
        self.window_s = window_s
        self.clock = StepClock()
        self.sender = Sender(address, backlog_frames=max(int(BACKLOG_S / window_s), 16))
        self.pid = os.getpid()
        self.started_t = time.time()
        self._facts: dict[str, Any] = {}
        self._hello: Hello | None = None
        self._model: Any = None
        # Read by the reporter thread, replaced whole (never mutated) by the training thread.
        self._probes: tuple[Probe, ...] = ()
        self._process_probe: ProcessProbe | None = None  # psutil: imported on the reporter thread
        self._train_tid = threading.get_native_id()  # the thread that calls gputop: the training thread
        self._train_ident = threading.get_ident()  # the same thread, as sys._current_frames() names it
        # (reporter thread CPU, bytes sent) at the last window; a new thread's CPU time starts at 0.
        self._cost_mark = (0.0, 0)
        self._call_cost_s: tuple[float, float] | None = None  # a step mark's and a tracked batch's cost
        self._hook_handles: list[Any] = []
        self._primary_optimizer: int | None = None
        self.manual_steps = False
        self._hook_marked = False  # the optimizer hook has marked a step (before any manual mark)
        self._seq = 0
        self._step_total = 0
        self._failed_probes: set[str] = set()
        self._reasons_said: set[tuple[str, str]] = set()  # (probe, why not measured), each sent once
        self._cuda = cuda
        # Every CUDA device a watched model was on, kept until the reporter thread drops their events at exit.
        self._cuda_devices: dict[int, RankCuda] = {}
        self._train_forwards = 0  # forwards with autograd on: micro-batches, counted on the training thread
        self._train_forwards_sent = 0  # read by the reporter thread at the last window
        self._grad_enabled: Any = None  # torch.is_grad_enabled, once a model is watched
        self._clock_errors_reported = 0
        self._refusal_said = False
        self._stop = threading.Event()
        # The reporter thread sleeps on this lock (held from the start, released by shutdown): one C call
        # per sleep, where Event.wait runs a Condition's Python code: it wakes up to 20 times a second for stacks.
        self._wake = threading.Lock()
        self._wake.acquire()
        self._thread = threading.Thread(target=self._run, name="gputop-reporter", daemon=True)
        self._facts_changed = threading.Event()
        # Set by the reporter thread when the dashboard asks for a profile; the training thread's step marks drive it.
        self._capture: ProfilerCapture | None = None
        self.trainer_log = TrainerLog()  # recent windows and the run's findings, for the trainer's logger
        # This host's GPUs for a collector on another machine: a child process, decided once connected.
        self._node_mode = node_sampler.mode()
        self._node = node_sampler.NodeSamplerChild()
        self._node_decided = self._node_mode == "off"
        # Where the training thread is (GPUTOP_STACKS, GPUTOP_STACKS_HZ): sampled only while a collector that
        # accepts stacks messages is connected, so with no dashboard, or an older one, it costs nothing.
        hz, self._stacks_complaint = stacks.configured_hz(os.environ)
        self._stacks = None if hz is None else stacks.StackSampler(self._train_ident, hz=hz, clock=self.clock)
        if self._stacks is not None:
            self._facts["sends"] = ("stacks",)
        self._stacks_connection = 0  # the sender's connection count when its collector accepted stacks
        # torch's Flight Recorder, where the user turned it on: read only while the training thread is stuck.
        dump = flight_recorder.dump_function() if flight_recorder.enabled(os.environ) else None
        self._flight = None if dump is None else flight_recorder.FlightRecorderReader(dump)
        self._flight_missing = dump is None and flight_recorder.enabled(os.environ)
        self._next_stacks_s = 0.0
        self._forward_codes: tuple[Any, ...] = ()  # the watched model's forward code (training thread writes)

    # -- training thread ------------------------------------------------------------

    def start(self) -> None:
        self._facts.update(facts.identity())
        self._facts.update(facts.torch_facts())
        self._refresh_hello()
        self._install_step_hook()
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
            self._forward_codes = stacks.forward_codes(model)
        self._facts.update(facts.model_facts(model))
        self._facts.update(facts.device_facts(self._facts.get("device")))
        if self._facts.get("data_parallel"):
            self._facts.update(facts.data_parallel_facts(model))
        self._facts.update(facts.identity())  # the process group may exist by now
        device = str(self._facts.get("device", ""))
        probes: list[Probe] = []
        if self._facts.get("ddp"):
            ddp = DdpProbe(model, on_cpu=device.startswith("cpu") or not device)
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
        self._probes = (*(p for p in self._probes if p.name not in {q.name for q in probes}), *probes)
        with contextlib.suppress(Exception):
            import torch

            self._grad_enabled = torch.is_grad_enabled
        with contextlib.suppress(Exception):
            self._hook_handles.append(model.register_forward_pre_hook(self._on_forward))
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
        if os.environ.get("GPUTOP_CUDA_EVENTS", "1") == "0":
            return GpuStepProbe(None, not_measured="CUDA events are off (GPUTOP_CUDA_EVENTS=0)")
        try:
            device = self._rank_cuda(index)
        except Exception as exc:
            return GpuStepProbe(None, not_measured=f"torch.cuda is not usable here ({type(exc).__name__})")
        self.clock.gpu_steps = device
        return GpuStepProbe(device)

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
        self._facts.update(facts.loader_facts(loader))
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

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # With several optimizers (GANs, per-module ones) one iteration steps each
        # of them: the first optimizer seen stands for the training step.
        if self.manual_steps or os.getpid() != self.pid:
            return
        if self._primary_optimizer is None:
            self._primary_optimizer = id(optimizer)
        if id(optimizer) == self._primary_optimizer:
            self._hook_marked = True
            self.clock.mark_step()
            capture = self._capture
            if capture is not None:
                capture.on_step()

    def _on_forward(self, module: Any, args: Any) -> None:
        # Autocast is thread-local and only visible around forward: look now and then.
        clock = self.clock
        clock.forwards += 1
        grad_enabled = self._grad_enabled
        if grad_enabled is not None and grad_enabled():  # evaluation forwards are no micro-batches
            self._train_forwards += 1
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

    # -- reporter thread ------------------------------------------------------------

    def _run(self) -> None:
        name_this_thread("gputop-reporter")
        next_window_s = time.monotonic() + self.window_s
        next_tick_s = time.monotonic() + TICK_S
        window_t0 = time.time()
        while True:
            cpu_before_wake_s = time.thread_time()  # what waking for a stack sample costs is the sampler's
            if self._wake.acquire(timeout=self._wait_s(next_tick_s)):
                break
            now = time.monotonic()
            self._sample_stack(now, cpu_before_wake_s)
            if now < next_tick_s:
                continue  # woken for a stack sample only
            next_tick_s = now + TICK_S
            try:
                if self._facts_changed.is_set():
                    self._facts_changed.clear()
                    self._refresh_hello()
                now = time.monotonic()
                if now >= next_window_s:
                    window_t0 = self._close_window(window_t0)
                    next_window_s += self.window_s
                    if next_window_s < now:  # the process was suspended; don't burst
                        next_window_s = now + self.window_s
                self._send_stacks(now)
                self.sender.pump(now)
                self._serve_capture(now)
                self._tend_node_sampler()
            except Exception as exc:  # a bug here must not end reporting for the run
                self._report_error("reporter", exc)
        self._final_flush(window_t0)

    def _wait_s(self, next_tick_s: float) -> float:
        """How long to sleep: until the next tick, or the next stack sample when one is sooner."""
        wait_s = next_tick_s - time.monotonic()
        if self._stacks is not None and self._stacks_accepted():
            wait_s = min(wait_s, self._stacks.next_s - time.monotonic())
        return max(wait_s, 0.0)

    # -- where the training thread is --------------------------------------------------

    def _stacks_accepted(self) -> bool:
        """The collector connected now said it reads stacks messages."""
        return self.sender.connected and self._stacks_connection == self.sender.connects

    def _sample_stack(self, now_s: float, cpu_before_wake_s: float) -> None:
        sampler = self._stacks
        if sampler is None or not self._stacks_accepted():
            return
        try:
            if self._forward_codes:
                sampler.watch_forwards(self._forward_codes)
            sampler.sample_when_due(now_s, cpu_before_wake_s)
        except Exception as exc:  # the sampler goes; reporting goes on without it
            self._stacks = None
            self._report_error("stacks", exc)

    def _send_stacks(self, now_s: float) -> None:
        """Every STACKS_EVERY_S, where the training thread was since the last time, to a collector that reads it."""
        sampler = self._stacks
        if sampler is None or now_s < self._next_stacks_s or not self._stacks_accepted():
            return
        self._next_stacks_s = now_s + STACKS_EVERY_S
        cpu_s = time.thread_time()
        hello = self._hello_or_new()
        message = sampler.take(hello.run_id, hello.rank, time.time())
        collective = self._last_collective(now_s)
        if collective is not None:
            message = msgspec.structs.replace(message, collective=collective)
        self.sender.enqueue(encode(message), this_connection_only=True)
        sampler.send_cost_s = time.thread_time() - cpu_s  # out of the sampler's budget, from the next second on

    def _last_collective(self, now_s: float) -> Collective | None:
        """The Flight Recorder's last entered collective while no step finishes; None otherwise, or on failure."""
        if self._flight is None:
            return None
        try:
            return self._flight.read_if_stuck(now_s, self.clock.since_mark_s())
        except Exception as exc:  # a torch without the dump, a malformed one: read no more
            self._flight = None
            self._report_error("flight_recorder", exc)
            return None

    def _accepted(self, command: Accepts, now_s: float) -> None:
        """The collector named the optional types it reads: start sampling if stacks is one (once per connection)."""
        if "stacks" not in command.types or self._stacks is None or self._stacks_accepted():
            return
        self._stacks_connection = self.sender.connects
        self._stacks.restart(now_s)
        self._next_stacks_s = now_s + STACKS_EVERY_S
        if self._stacks_complaint:
            self._report_error("stacks_hz", ValueError(self._stacks_complaint))

    def _serve_capture(self, now_s: float) -> None:
        """Take capture requests from the dashboard; send the result of a finished capture."""
        for frame in self.sender.read_commands():
            try:
                command = decode_command(frame)
                if isinstance(command, FindingsNotice):
                    self.trainer_log.findings = command
                elif isinstance(command, Accepts):
                    self._accepted(command, now_s)
                else:
                    self._start_capture(command)
            except ProtocolError as exc:
                self._report_error("command", exc)  # a bad command is named once, and otherwise ignored
        capture = self._capture
        if capture is None:
            return
        capture.give_up_if_stale(now_s)
        if capture.finished:
            self._capture = None
            self.sender.enqueue(encode(capture.result()))

    def _tend_node_sampler(self) -> None:
        """Start this host's node sampler once, when the rule says so; say once if it ended early."""
        if self._node_decided:
            if self._node.process is not None and self._node.exit_code is None:
                code = self._node.exited()
                if code is not None:
                    self._report_error("node_sampler", RuntimeError(f"the node sampler exited with code {code}"))
            return
        if self._node_mode == "auto" and not self.sender.connected:
            return  # whether the collector is another machine is known once connected
        self._node_decided = True
        hello = self._hello_or_new()
        if not node_sampler.wanted(self._node_mode, hello.local_rank, self.sender.remote_link):
            return
        try:
            self._node.start(self.sender.address, self.pid)
        except Exception as exc:
            self._report_error("node_sampler", exc)
            return
        assert self._node.process is not None and self._node.spawn_s is not None
        note = f"started this host's GPU sampler (pid {self._node.process.pid}) in {self._node.spawn_s * 1e3:.1f} ms"
        self.sender.enqueue(
            encode(Event(run_id=hello.run_id, rank=hello.rank, t=time.time(), kind="node_sampler", message=note))
        )

    def _start_capture(self, request: CaptureRequest) -> None:
        hello = self._hello_or_new()
        why = torch_profiler_available()
        if (request.run_id and request.run_id != hello.run_id) or request.rank != hello.rank:
            why = f"this connection speaks for {hello.run_id} rank {hello.rank}"
        elif self._capture is not None:
            why = f"capture {self._capture.request.id} is still running on this rank"
        if why:
            refusal = CaptureResult(run_id=hello.run_id, rank=hello.rank, id=request.id, t=time.time(), ok=False,
                                    error=why)  # fmt: skip
            self.sender.enqueue(encode(refusal))
            return
        device = self._facts.get("device")
        self._capture = ProfilerCapture(request, run_id=hello.run_id, rank=hello.rank, device=device)

    def _final_flush(self, window_t0: float) -> None:
        try:
            self._close_window(window_t0)
            self._release_cuda()
            bye = Bye(
                run_id=self._hello_or_new().run_id,
                rank=self._hello_or_new().rank,
                t=time.time(),
                step_total=self._step_total,
                dropped=self.sender.dropped,
            )
            self.sender.enqueue(encode(bye))
            deadline = time.monotonic() + EXIT_FLUSH_S
            while time.monotonic() < deadline:
                self.sender.pump()
                if self.sender.idle or not self.sender.connected:
                    break
                time.sleep(0.01)
            # Sent means handed to the kernel: hang up gracefully so it is not thrown away.
            self.sender.close(linger_s=max(deadline - time.monotonic(), EXIT_LINGER_MIN_S))
            self._node.stop()
        except Exception:
            pass

    def _release_cuda(self) -> None:
        """Drop the step events here, each with its device current, not wherever the interpreter's exit would."""
        self.clock.gpu_steps = None
        for device in self._cuda_devices.values():
            with contextlib.suppress(Exception):
                device.release()

    def _hello_or_new(self) -> Hello:
        if self._hello is None:
            self._refresh_hello()
        assert self._hello is not None
        return self._hello

    def _refresh_hello(self) -> None:
        # A copy: the training thread adds facts (autocast, the loader) while we read them.
        hello = facts.build_hello(dict(self._facts), self.window_s, self.started_t, __version__)
        if hello == self._hello:
            return
        old, self._hello = self._hello, hello
        if old is not None and (old.run_id, old.rank) != (hello.run_id, hello.rank):
            # The rank learned its real name (init_process_group ran after track() or step()).
            # Queued frames carry the old name: on a reconnect they would follow the new
            # hello and be refused, so they go; on a live connection the old name says bye.
            if self.sender.connected:
                bye = Bye(run_id=old.run_id, rank=old.rank, t=time.time(), step_total=self._step_total)
                self.sender.enqueue(encode(bye))
            else:
                self.sender.forget_queued()
        self.sender.set_hello(encode(hello))

    def _self_cost(self, marks: int, batches: int) -> dict[str, Any]:
        """What gputop cost this rank since the last window: its thread's CPU, its hooks, its bytes.

        The hooks' time is their calibrated per-call cost times the calls (see
        ``clock.calibrate``), measured once on this thread; the calibration's
        own CPU lands in ``reporter_cpu_s`` like everything else this thread does.
        """
        if self._call_cost_s is None:
            self._call_cost_s = calibrate()
        mark_s, batch_s = self._call_cost_s
        cpu_s, sent = time.thread_time(), self.sender.sent_bytes
        before, self._cost_mark = self._cost_mark, (cpu_s, sent)
        return {
            "reporter_cpu_s": max(cpu_s - before[0], 0.0),
            "hook_s": marks * mark_s + batches * batch_s,
            "sent_bytes": max(sent - before[1], 0),
        }

    def _learn_ddp_settings(self) -> None:
        """DDP's build settings, once its probe has read them: into the hello (reporter thread)."""
        for probe in self._probes:
            settings = getattr(probe, "settings", None)
            if settings and any(self._facts.get(k) != v for k, v in settings.items()):
                self._facts.update(settings)
                self._refresh_hello()

    def _window_probes(self) -> tuple[Probe, ...]:
        """The model's probes, then the process probe, made on this thread at the first window."""
        if self._process_probe is None and "cpu" not in self._failed_probes:
            try:
                self._process_probe = ProcessProbe(self._train_tid)
            except Exception as exc:
                self._report_error("cpu", exc)
        return self._probes if self._process_probe is None else (*self._probes, self._process_probe)

    def _report_error(self, probe: str, exc: BaseException) -> None:
        if probe in self._failed_probes:
            return
        self._failed_probes.add(probe)
        hello = self._hello_or_new()
        message = f"{probe}: {type(exc).__name__}: {exc}"[:500]
        self.sender.enqueue(
            encode(Event(run_id=hello.run_id, rank=hello.rank, t=time.time(), kind="error", message=message))
        )

    def _say_why_not_measured(self, probe: Probe) -> None:
        """A probe's reason for N/A fields, sent once per reason as a ``not_measured`` event: "<probe>: <why>"."""
        self._say_not_measured(probe.name, probe.not_measured)

    def _say_not_measured(self, name: str, reason: str | None) -> None:
        if not reason or (name, reason) in self._reasons_said:
            return
        self._reasons_said.add((name, reason))
        hello = self._hello_or_new()
        message = f"{name}: {reason}"[:500]
        self.sender.enqueue(
            encode(Event(run_id=hello.run_id, rank=hello.rank, t=time.time(), kind="not_measured", message=message))
        )

    def _close_window(self, t0: float) -> float:
        """Build and enqueue the window that ends now; return its end time."""
        t1 = time.time()
        marks = self.clock.drain()
        hello = self._hello_or_new()
        fields = step_fields(marks, self._facts.get("loader_batch_size"), first_step=self._step_total + 1)
        self._step_total += len(marks)
        fields["step_total"] = self._step_total
        fields["dropped"] = self.sender.dropped
        fields.update(self._self_cost(len(marks), fields["loader_batches"]))
        for probe in self._window_probes():
            try:
                fields.update(probe.read(marks))
            except Exception as exc:
                self._report_error(probe.name, exc)
            self._say_why_not_measured(probe)
        if self._flight_missing:
            self._say_not_measured("flight_recorder", flight_recorder.NO_DUMP)
        self._learn_ddp_settings()
        if self._grad_enabled is not None:
            forwards, self._train_forwards_sent = self._train_forwards - self._train_forwards_sent, self._train_forwards
            fields["forwards"] = max(forwards, 0)
        if self.clock.errors > self._clock_errors_reported:
            self._clock_errors_reported = self.clock.errors
            self._report_error("step_mark", RuntimeError(f"{self.clock.errors} step mark(s) failed; CUDA events off"))
        if self.sender.refused and not self._refusal_said:
            self._refusal_said = True
            sys.stderr.write(f"gputop: not reporting: {self.sender.refused}\n")
        self._seq += 1
        window = Window(run_id=hello.run_id, rank=hello.rank, seq=self._seq, t0=t0, t1=t1, **fields)
        self.sender.enqueue(encode(window))
        self.trainer_log.recent.append(window)
        self._write_logs()
        return t1

    # -- the trainer's logger ------------------------------------------------------------

    def figures(self) -> dict[str, float]:
        """This rank's recent step breakdown and its run's findings, as logger keys; any thread."""
        return self.trainer_log.figures(self._hello_or_new().rank)

    def log_to(self, writer: Any, every_s: float) -> None:
        """Write ``figures()`` to a TensorBoard-like writer (``add_scalar``) from this thread every ``every_s``."""
        self.trainer_log.add_writer(writer, every_s)

    def _write_logs(self) -> None:
        try:
            self.trainer_log.write_due(self._hello_or_new().rank, self._step_total, time.monotonic())
        except Exception as exc:
            self._report_error("log_to", exc)
