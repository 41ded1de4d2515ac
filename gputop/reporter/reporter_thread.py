"""The reporter thread: a daemon in each training process that turns step marks into windows and sends them.

Every ``window_s`` it drains the training thread's step marks, asks each probe
(``gputop.reporter.probes``: DDP timings, CUDA memory, GPU step events, the
process's CPU) for its fields, builds one ``Window`` and hands it to the
sender.  Between windows, twice per window, it connects and flushes, keeps the
hello up to date with the facts the training thread learned, serves the
dashboard's commands (profile captures, the run's findings for the trainer's
logger, the optional types it reads), sends where the training thread is
(``stack_reporting``) and starts this host's node sampler when the rule says
so.  At exit it sends the last window and a bye.  It catches everything: a
failing probe turns its columns to N/A and is reported once as an event.

``ReporterThread`` is the half of ``Reporter`` (``reporter.py``) that runs on
this thread; the training thread's half sets what it reads before it starts.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from gputop import __version__
from gputop.address import Address
from gputop.combine import merge_collectives
from gputop.peaks import rank_peak
from gputop.processes.procfs import name_this_thread
from gputop.protocol import (
    Accepts,
    Bye,
    CaptureRequest,
    CaptureResult,
    Event,
    FindingsNotice,
    Hello,
    ProtocolError,
    Window,
    decode_command,
    encode,
)
from gputop.reporter import facts, flight_recorder, node_sampler
from gputop.reporter.capture import ProfilerCapture, torch_profiler_available
from gputop.reporter.clock import StepClock
from gputop.reporter.collectives import CollectiveTap
from gputop.reporter.ending import Ending
from gputop.reporter.flops import FlopCounter
from gputop.reporter.probes import Probe
from gputop.reporter.probes.process import ProcessProbe
from gputop.reporter.rank_cuda import RankCuda
from gputop.reporter.self_cost import SelfCost
from gputop.reporter.sender import Sender
from gputop.reporter.stack_reporting import StackReporting
from gputop.reporter.trainer_figures import TrainerLog
from gputop.reporter.window import ddp_exchange, flops_fields, hook_phase_fields, step_fields

BACKLOG_S = 600.0  # ten minutes of windows wait for a dashboard that starts late
TICK_S = 0.25  # how often the thread wakes to connect and flush while it has something to (else once per window)
# A wake for a stack sample this close before a flush tick does the tick's work too: one wake-up, not two.  A wake
# costs ~50-100 µs of CPU on a 2-vCPU VM (the kernel, the GIL, caches gone cold), more than a tick's work.
TICK_EARLY_S = TICK_S / 2
# And a tick (a window's too) waits this long for a stack sample's wake rather than wake on its own: the window
# closes a little late (its t0 and t1 say so), the thread wakes once where it would have woken twice.
TICK_LATE_S = 0.1
EXIT_FLUSH_S = 1.0  # the most process exit waits for the last window to leave
EXIT_LINGER_MIN_S = 0.2  # and then for the dashboard to take it, however long the flush took


class ReporterThread:
    """The reporter thread's loop and everything it does; ``Reporter`` adds what the training thread calls."""

    # Set by the training thread's half before this half's __init__ runs, and read here.
    window_s: float
    clock: StepClock
    pid: int
    started_t: float
    _facts: dict[str, Any]  # written by the training thread; the hello is built from a copy
    _facts_changed: threading.Event
    _probes: tuple[Probe, ...]  # replaced whole (never mutated) by the training thread
    _train_tid: int
    _train_ident: int
    _grad_enabled: Callable[[], bool] | None  # torch.is_grad_enabled, once a model is watched
    _train_forwards: int
    _cuda_devices: dict[int, RankCuda]
    # Set here when the dashboard asks for a profile; the training thread's step marks drive it.
    _capture: ProfilerCapture | None
    tap: CollectiveTap  # times collectives while a collector listens (``on``, set here)
    # Each step's (FLOPs or None, ran under counting), appended at its step mark just before the mark itself: a
    # window's marks are paired with as many of these, oldest first.  The counter, once a model is watched.
    step_work: deque[tuple[int | None, bool]]
    _flops: FlopCounter | None

    def __init__(self, address: Address) -> None:
        self.sender = Sender(address, backlog_frames=max(int(BACKLOG_S / self.window_s), 16))
        self._hello: Hello | None = None
        self._process_probe: ProcessProbe | None = None  # psutil: imported on the reporter thread
        self._self_cost = SelfCost(self.sender)
        self.ending = Ending()  # what ended the process, for the bye (installed by Reporter.start)
        self._seq = 0
        self._step_total = 0
        self._failed_probes: set[str] = set()
        self._reasons_said: set[tuple[str, str]] = set()  # (probe, why not measured), each sent once
        self._train_forwards_sent = 0  # _train_forwards at the last window
        self._ddp_settings_learned: object = None  # the DDP probe's settings last put into the hello (by identity)
        self._clock_errors_reported = 0
        self._refusal_said = False
        self._stop = threading.Event()
        # The reporter thread sleeps on this lock (held from the start, released by shutdown): one C call
        # per sleep, where Event.wait runs a Condition's Python code: it wakes up to 20 times a second for stacks.
        self._wake = threading.Lock()
        self._wake.acquire()
        self._thread = threading.Thread(target=self._run, name="gputop-reporter", daemon=True)
        self.trainer_log = TrainerLog()  # recent windows and the run's findings, for the trainer's logger
        # This host's GPUs for a collector on another machine: a child process, decided once connected.
        self._node_mode = node_sampler.mode()
        self._node = node_sampler.NodeSamplerChild()
        self._node_decided = self._node_mode == "off"
        # Where the training thread is: sampled only while a collector that accepts stacks messages is connected.
        self._stacks = StackReporting(
            self.sender, self.clock, self._train_ident, hello=self._hello_or_new, report_error=self._report_error
        )
        if self._stacks.sampler is not None:
            self._facts["sends"] = ("stacks",)

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
            self._stacks.sample(now, cpu_before_wake_s)
            # The window's tick comes on time; a flush tick may come early, with a stack sample's wake.
            if now < next_tick_s - (TICK_EARLY_S if next_tick_s < next_window_s else 0.0):
                continue  # woken for a stack sample only, no tick close
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
                self._stacks.send(now)
                self.sender.pump(now)
                # Nothing is timed while no collector listens; read after the pump, which makes the connection:
                # connected and idle, the next tick is the next window's, and a second would go untimed.
                self.tap.on = self.sender.connected
                self._serve_commands(now)
                self._tend_node_sampler()
            except Exception as exc:  # a bug here must not end reporting for the run
                self._report_error("reporter", exc)
            next_tick_s = self._next_tick_s(now, next_tick_s, next_window_s)
        self._final_flush(window_t0)

    def _next_tick_s(self, now: float, last_tick_s: float, next_window_s: float) -> float:
        """When to tick next: at the next window, or sooner while there is a connection to make or bytes to flush.

        Connected with nothing queued, a tick between windows would only look for the dashboard's commands:
        they wait for the window's tick (at most ``window_s``), and the thread wakes half as often.
        """
        if self.sender.connected and self.sender.idle:
            return next_window_s
        return min(max(last_tick_s, now) + TICK_S, next_window_s)

    def _wait_s(self, next_tick_s: float) -> float:
        """How long to sleep: until the next tick, or the next stack sample when one is sooner or soon after."""
        wait_s = next_tick_s - time.monotonic()
        late_s = wait_s + TICK_LATE_S
        sample_s = self._stacks.wait_s(late_s)
        return max(sample_s if sample_s < late_s else wait_s, 0.0)

    # -- windows ---------------------------------------------------------------------

    def _close_window(self, t0: float) -> float:
        """Build and enqueue the window that ends now; return its end time."""
        t1 = time.time()
        marks = self.clock.drain()
        hello = self._hello_or_new()
        fields = step_fields(marks, self._facts.get("loader_batch_size"), first_step=self._step_total + 1)
        fields.update(flops_fields(marks, self._step_work(len(marks))))
        self._step_total += len(marks)
        fields["step_total"] = self._step_total
        fields["dropped"] = self.sender.dropped
        fields.update(self._self_cost.since_last_window(len(marks), fields["loader_batches"]))
        collectives = []
        for probe in self._window_probes():
            try:
                read = probe.read(marks)
                collectives.append(read.pop("collectives", ()))
                fields.update(read)
            except Exception as exc:
                self._report_error(probe.name, exc)
            self._say_why_not_measured(probe)
            for kind, note in getattr(probe, "take_notes", list)():  # what a probe saw happen: a recompile
                self._send_event(kind, note)
        self._learn_ddp_settings()  # its buckets and gradient bytes size DDP's row among the collectives
        exchange = ddp_exchange(fields, self._facts.get("ddp_buckets"), self._facts.get("ddp_gradient_bytes"),
                                self._facts.get("ddp_group") or "world")  # fmt: skip
        if exchange is not None and not self._exchange_tapped(exchange.group, collectives):
            collectives.append((exchange,))
        if any(collectives):
            fields["collectives"] = merge_collectives(collectives)
        if self.clock.times_phases and "comm_s" not in fields:
            fields.update(hook_phase_fields(marks, fields.get("collectives", ())))
        if self._stacks.flight_missing:
            self._say_not_measured("flight_recorder", flight_recorder.NO_DUMP)
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

    def _step_work(self, steps: int) -> list[tuple[int | None, bool]]:
        """The work of the window's ``steps`` marks, oldest first; the counter's note and dtype mix into the hello
        when they changed (read here, on the reporter thread: the training thread only counts)."""
        work, queue = [], self.step_work
        for _ in range(steps):
            try:
                work.append(queue.popleft())
            except IndexError:
                break
        counter = self._flops
        if counter is not None:
            note = counter.figure()[1] or ""
            mix = counter.mix() or None
            if self._facts.get("flops_note") != note or self._facts.get("flops_mix") != mix:
                self._facts["flops_note"], self._facts["flops_mix"] = note, mix
                self._facts_changed.set()
            facts = self._facts
            self.trainer_log.peak_flops = rank_peak(
                str(facts.get("device", "")).startswith("cuda"),
                facts.get("device_name"),
                mix,
                bool(facts.get("tf32_matmul")),
                bool(facts.get("tf32_cudnn")),
                facts.get("cpu_peak_flops"),
            )[0]
        return work

    def _exchange_tapped(self, group: str, collectives: list[Any]) -> bool:
        """Whether the collective tap timed DDP's gradient exchange itself: a Python comm hook's all-reduces.

        Then DDP's own row would count it twice.  Without such a hook (DDP's reducer
        all-reduces in C++, out of the tap's sight) an all-reduce the tap saw on the
        same group is the script's own (a loss averaged for the log, a stop flag),
        and DDP's row is added beside it: one row, both counted.
        """
        if not self._facts.get("ddp_python_comm_hook"):
            return False
        return any(c.kind == "all_reduce" and c.group == group for timed in collectives for c in timed)

    def _window_probes(self) -> tuple[Probe, ...]:
        """The model's probes, then the process probe, made on this thread at the first window."""
        if self._process_probe is None and "cpu" not in self._failed_probes:
            try:
                self._process_probe = ProcessProbe(self._train_tid)
            except Exception as exc:
                self._report_error("cpu", exc)
        return self._probes if self._process_probe is None else (*self._probes, self._process_probe)

    def _learn_ddp_settings(self) -> None:
        """DDP's build settings, once its probe has read them: into the hello (reporter thread)."""
        for probe in self._probes:
            settings = getattr(probe, "settings", None)
            if not settings or settings is self._ddp_settings_learned:
                continue  # none yet, or read once and learned already: nothing to compare every window
            self._ddp_settings_learned = settings
            if any(self._facts.get(k) != v for k, v in settings.items()):
                self._facts.update(settings)
                self._refresh_hello()

    def _write_logs(self) -> None:
        try:
            self.trainer_log.write_due(self._hello_or_new().rank, self._step_total, time.monotonic())
        except Exception as exc:
            self._report_error("log_to", exc)

    # -- what the rank says about itself ---------------------------------------------

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

    def _report_error(self, probe: str, exc: BaseException) -> None:
        if probe in self._failed_probes:
            return
        self._failed_probes.add(probe)
        hello = self._hello_or_new()
        message = f"{probe}: {type(exc).__name__}: {exc}"[:500]
        self.sender.enqueue(
            encode(Event(run_id=hello.run_id, rank=hello.rank, t=time.time(), kind="error", message=message))
        )

    def _send_event(self, kind: str, message: str) -> None:
        hello = self._hello_or_new()
        self.sender.enqueue(
            encode(Event(run_id=hello.run_id, rank=hello.rank, t=time.time(), kind=kind, message=message[:500]))
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

    # -- the dashboard's commands, and this host's node sampler ------------------------

    def _serve_commands(self, now_s: float) -> None:
        """Take the dashboard's commands (captures, findings, accepted types); send a finished capture's result."""
        for frame in self.sender.read_commands():
            try:
                command = decode_command(frame)
                if isinstance(command, FindingsNotice):
                    self.trainer_log.findings = command
                elif isinstance(command, Accepts):
                    self._stacks.on_accepts(command, now_s)
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

    # -- process exit ----------------------------------------------------------------

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
                how=self.ending.how,
                detail=self.ending.detail,
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
