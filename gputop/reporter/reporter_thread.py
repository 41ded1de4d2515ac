"""The reporter thread: a daemon in each training process that turns step marks into windows and sends them.

Every ``window_s`` it drains the training thread's step marks, asks each probe
(``gputop.reporter.probes``: DDP timings, CUDA memory, GPU step events, the
process's CPU) for its fields, builds one ``Window`` and hands it to the
sender.  Between windows, twice per window, it connects and flushes, keeps the
hello up to date with the facts the training thread learned (``announcer.py``),
serves the dashboard's commands (``commands.py``: profile captures, the run's
findings for the trainer's logger, the optional types it reads), sends where
the training thread is (``stack_reporting``) and starts this host's node
sampler when the rule says so.  At exit it sends the last window and a bye.  It
catches everything: a failing probe turns its columns to N/A and is reported
once as an event.

``Reporter`` (``reporter.py``) owns one and hands it the parts of the training
thread it reads (``training_side.TrainingSide``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any

from gputop.address import Address
from gputop.combine import merge_collectives
from gputop.peaks import rank_peak
from gputop.processes.procfs import name_this_thread
from gputop.protocol import Bye, Window, encode
from gputop.reporter import flight_recorder, node_sampler
from gputop.reporter.announcer import Announcer
from gputop.reporter.commands import Commands
from gputop.reporter.facts import tf32_facts
from gputop.reporter.probes import Probe
from gputop.reporter.probes.process import ProcessProbe
from gputop.reporter.self_cost import SelfCost
from gputop.reporter.sender import Sender
from gputop.reporter.stack_reporting import StackReporting
from gputop.reporter.trainer_figures import TrainerLog
from gputop.reporter.training_side import TrainingSide
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
    """The reporter thread's loop and everything it does, reading what the training thread shares in ``side``."""

    def __init__(self, address: Address, side: TrainingSide) -> None:
        self._side = side
        self.sender = Sender(address, backlog_frames=max(int(BACKLOG_S / side.window_s), 16))
        self.announcer = Announcer(self.sender, side, lambda: self.step_total)
        self._process_probe: ProcessProbe | None = None  # psutil: imported on the reporter thread
        self._self_cost = SelfCost(self.sender)
        self._seq = 0
        self.step_total = 0  # the steps reported so far
        self._train_forwards_sent = 0  # the side's train_forwards at the last window
        self._ddp_settings_learned: object = None  # the DDP probe's settings last put into the hello (by identity)
        self._clock_errors_reported = 0
        self._refusal_said = False
        self._stop = threading.Event()
        self._flush_s = EXIT_FLUSH_S  # what the last window and the bye may take: less on SIGTERM
        # The reporter thread sleeps on this lock (held from the start, released by stop): one C call
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
        announcer = self.announcer
        self.stacks = StackReporting(
            self.sender,
            side.clock,
            side.train_ident,
            hello=announcer.hello,
            report_error=announcer.report_error,
            tap=side.tap,
        )
        if self.stacks.sampler is not None:
            side.facts["sends"] = ("stacks",)
        self._commands = Commands(self.sender, announcer, side, trainer_log=self.trainer_log, stacks=self.stacks)

    def start(self) -> None:
        self._thread.start()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self, timeout_s: float, flush_s: float = EXIT_FLUSH_S) -> None:
        """Wake the thread to send the last window and a bye, within ``flush_s`` and a linger; wait at most
        ``timeout_s`` for it (not from itself)."""
        self._flush_s = flush_s
        self._stop.set()
        self._wake.release()
        self.join(timeout_s)

    def join(self, timeout_s: float) -> None:
        """Wait at most ``timeout_s`` for the thread to end (its bye sent); not from itself."""
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        name_this_thread("gputop-reporter")
        next_window_s = time.monotonic() + self._side.window_s
        next_tick_s = time.monotonic() + TICK_S
        window_t0 = time.time()
        while True:
            cpu_before_wake_s = time.thread_time()  # what waking for a stack sample costs is the sampler's
            if self._wake.acquire(timeout=self._wait_s(next_tick_s)):
                break
            now = time.monotonic()
            self.stacks.sample(now, cpu_before_wake_s)
            # The window's tick comes on time; a flush tick may come early, with a stack sample's wake.
            if now < next_tick_s - (TICK_EARLY_S if next_tick_s < next_window_s else 0.0):
                continue  # woken for a stack sample only, no tick close
            try:
                if self._side.facts_changed.is_set():
                    self._side.facts_changed.clear()
                    self.announcer.refresh_hello()
                now = time.monotonic()
                if now >= next_window_s:
                    window_t0 = self._close_window(window_t0)
                    next_window_s += self._side.window_s
                    if next_window_s < now:  # the process was suspended; don't burst
                        next_window_s = now + self._side.window_s
                self.stacks.send(now)
                self.sender.pump(now)
                # Nothing is timed while no collector listens; read after the pump, which makes the connection:
                # connected and idle, the next tick is the next window's, and a second would go untimed.
                self._side.tap.on = self.sender.connected
                self._commands.serve(now)
                self._tend_node_sampler()
            except Exception as exc:  # a bug here must not end reporting for the run
                self.announcer.report_error("reporter", exc)
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
        sample_s = self.stacks.wait_s(late_s)
        return max(sample_s if sample_s < late_s else wait_s, 0.0)

    # -- windows ---------------------------------------------------------------------

    def _close_window(self, t0: float) -> float:
        """Build and enqueue the window that ends now; return its end time."""
        side, facts, announcer = self._side, self._side.facts, self.announcer
        t1 = time.time()
        marks = side.clock.drain()
        hello = announcer.hello()
        fields = step_fields(marks, facts.get("loader_batch_size"), first_step=self.step_total + 1)
        fields.update(flops_fields(marks, self._step_work(len(marks))))
        self.step_total += len(marks)
        fields["step_total"] = self.step_total
        fields["dropped"] = self.sender.dropped
        fields.update(self._self_cost.since_last_window(len(marks), fields["loader_batches"]))
        collectives = []
        for probe in self._window_probes():
            try:
                read = probe.read(marks)
                collectives.append(read.pop("collectives", ()))
                fields.update(read)
            except Exception as exc:
                announcer.report_error(probe.name, exc)
            announcer.say_why_not_measured(probe)
            for kind, note in getattr(probe, "take_notes", list)():  # what a probe saw happen: a recompile
                announcer.send_event(kind, note)
        self._learn_ddp_settings()  # its buckets and gradient bytes size DDP's row among the collectives
        exchange = ddp_exchange(fields, facts.get("ddp_buckets"), facts.get("ddp_gradient_bytes"),
                                facts.get("ddp_group") or "world", facts.get("ddp_group_ranks"))  # fmt: skip
        if exchange is not None and not self._exchange_tapped(exchange.group, collectives):
            collectives.append((exchange,))
        if any(collectives):
            fields["collectives"] = merge_collectives(collectives)
        if side.clock.times_phases and "comm_s" not in fields:
            fields.update(hook_phase_fields(marks, fields.get("collectives", ())))
        if self.stacks.flight_missing:
            announcer.say_not_measured("flight_recorder", flight_recorder.NO_DUMP)
        if side.grad_enabled is not None:
            forwards, self._train_forwards_sent = side.train_forwards - self._train_forwards_sent, side.train_forwards
            fields["forwards"] = max(forwards, 0)
        self._say_what_went_wrong()
        self._seq += 1
        window = Window(run_id=hello.run_id, rank=hello.rank, seq=self._seq, t0=t0, t1=t1, **fields)
        self.sender.enqueue(encode(window))
        self.trainer_log.recent.append(window)
        self._write_logs()
        return t1

    def _say_what_went_wrong(self) -> None:
        """Step marks that failed since the last window, as an error event; the collector's refusal, on stderr."""
        clock = self._side.clock
        if clock.errors > self._clock_errors_reported:
            self._clock_errors_reported = clock.errors
            failed = RuntimeError(f"{clock.errors} step mark(s) failed; CUDA events off")
            self.announcer.report_error("step_mark", failed)
        if self.sender.refused and not self._refusal_said:
            self._refusal_said = True
            sys.stderr.write(f"gputop: not reporting: {self.sender.refused}\n")

    def _step_work(self, steps: int) -> list[tuple[int | None, bool]]:
        """The work of the window's ``steps`` marks, oldest first; the counter's note and dtype mix into the hello
        when they changed (read here, on the reporter thread: the training thread only counts)."""
        work, queue = [], self._side.step_work
        for _ in range(steps):
            try:
                work.append(queue.popleft())
            except IndexError:
                break
        counter, facts = self._side.flops, self._side.facts
        if counter is not None:
            note = counter.count()[1] or ""
            mix = counter.mix() or None
            # TF32 as the script has it now: one that allows it after watch() gets the TF32 peak, not float32's.
            tf32 = tf32_facts()
            if facts.get("flops_note") != note or facts.get("flops_mix") != mix or _changed(facts, tf32):
                facts["flops_note"], facts["flops_mix"] = note, mix
                facts.update(tf32)
                self._side.facts_changed.set()
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
        if not self._side.facts.get("ddp_python_comm_hook"):
            return False
        return any(c.kind == "all_reduce" and c.group == group for timed in collectives for c in timed)

    def _window_probes(self) -> tuple[Probe, ...]:
        """The model's probes, then the process probe, made on this thread at the first window."""
        if self._process_probe is None and "cpu" not in self.announcer.failed_probes:
            try:
                self._process_probe = ProcessProbe(self._side.train_tid)
            except Exception as exc:
                self.announcer.report_error("cpu", exc)
        probes = self._side.probes
        return probes if self._process_probe is None else (*probes, self._process_probe)

    def _learn_ddp_settings(self) -> None:
        """DDP's build settings, once its probe has read them: into the hello (reporter thread)."""
        for probe in self._side.probes:
            settings = getattr(probe, "settings", None)
            if not settings or settings is self._ddp_settings_learned:
                continue  # none yet, or read once and learned already: nothing to compare every window
            self._ddp_settings_learned = settings
            facts = self._side.facts
            if any(facts.get(k) != v for k, v in settings.items()):
                facts.update(settings)
                self.announcer.refresh_hello()

    def _write_logs(self) -> None:
        try:
            self.trainer_log.write_due(self.announcer.hello().rank, self.step_total, time.monotonic())
        except Exception as exc:
            self.announcer.report_error("log_to", exc)

    # -- this host's node sampler -------------------------------------------------------

    def _tend_node_sampler(self) -> None:
        """Start this host's node sampler once, when the rule says so; say once if it ended early."""
        if self._node_decided:
            if self._node.process is not None and self._node.exit_code is None:
                code = self._node.exited()
                if code is not None:
                    ended = RuntimeError(f"the node sampler exited with code {code}")
                    self.announcer.report_error("node_sampler", ended)
            return
        if self._node_mode == "auto" and not self.sender.connected:
            return  # whether the collector is another machine is known once connected
        self._node_decided = True
        hello = self.announcer.hello()
        if not node_sampler.wanted(self._node_mode, hello.local_rank, self.sender.remote_link):
            return
        try:
            self._node.start(self.sender.address, self._side.pid)
        except Exception as exc:
            self.announcer.report_error("node_sampler", exc)
            return
        assert self._node.process is not None and self._node.spawn_s is not None
        note = f"started this host's GPU sampler (pid {self._node.process.pid}) in {self._node.spawn_s * 1e3:.1f} ms"
        self.announcer.send_event("node_sampler", note)

    # -- process exit ----------------------------------------------------------------

    def _final_flush(self, window_t0: float) -> None:
        try:
            self._close_window(window_t0)
            self._release_cuda()
            self.sender.enqueue(encode(self._bye()))
            deadline = time.monotonic() + self._flush_s
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

    def _bye(self) -> Bye:
        hello, ending = self.announcer.hello(), self._side.ending
        return Bye(run_id=hello.run_id, rank=hello.rank, t=time.time(), step_total=self.step_total,
                   dropped=self.sender.dropped, how=ending.how, detail=ending.detail)  # fmt: skip

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def bye_apart(self, bound_s: float) -> None:
        """The bye on a connection of its own, from another thread, when this one is stuck short of sending it
        (in a probe: DDP's logger waits on DDP's lock while an all-reduce waits for a peer).  Its own sender
        and socket: nothing of this thread's is touched.  Waits at most ``bound_s`` for it; never raises."""
        with contextlib.suppress(Exception):
            sender = Sender(self.sender.address, backlog_frames=4, security=self.sender.security)
            sender.set_hello(encode(self.announcer.hello()))
            sender.enqueue(encode(self._bye()))
            apart = threading.Thread(target=_flush_alone, args=(sender, bound_s), name="gputop-bye", daemon=True)
            apart.start()
            apart.join(bound_s)

    def _release_cuda(self) -> None:
        """Drop the step events here, each with its device current, not wherever the interpreter's exit would."""
        self._side.clock.gpu_steps = None
        for device in self._side.cuda_devices.values():
            with contextlib.suppress(Exception):
                device.release()


def _flush_alone(sender: Sender, bound_s: float) -> None:
    """Connect, send what ``sender`` holds and hang up, within ``bound_s`` (a TCP handshake may take longer: the
    caller stops waiting then)."""
    deadline = time.monotonic() + bound_s
    with contextlib.suppress(Exception):
        while time.monotonic() < deadline:
            sender.pump()
            if sender.connected and sender.idle:
                break
            time.sleep(0.01)
        sender.close(linger_s=max(deadline - time.monotonic(), 0.0))


def _changed(facts: dict[str, Any], found: dict[str, Any]) -> bool:
    return any(facts.get(key) != value for key, value in found.items())
