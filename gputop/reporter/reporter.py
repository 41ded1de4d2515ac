"""The reporter: a daemon thread in each training process that turns step marks into windows.

Every ``window_s`` it drains the training thread's step marks, reads DDP's
runtime statistics, CUDA memory counters and the process's CPU, builds one
``Window`` and hands it to the sender.  It catches everything: a failing probe
turns its columns to N/A and is reported once as an event.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from typing import Any

from gputop import __version__
from gputop.address import Address
from gputop.protocol import Bye, Event, Hello, Window, encode, hist_bucket
from gputop.reporter import facts
from gputop.reporter.clock import StepClock, StepMark
from gputop.reporter.sender import Sender

DEFAULT_WINDOW_S = 0.5
BACKLOG_S = 600.0  # ten minutes of windows wait for a dashboard that starts late
TICK_S = 0.1  # how often the thread wakes to connect and flush between windows
EXIT_FLUSH_S = 1.0  # the most process exit waits for the last window to leave
# DDP times forward/backward/comm on every Nth iteration (PyTorch's default is
# 100).  On CUDA a sampled iteration waits for the previous one's events at the
# next forward, so N trades freshness for a rare short stall.  On the CPU the
# timer is two clock reads, so every iteration is timed.
DEFAULT_DDP_SAMPLE_RATE = 10
CPU_DDP_SAMPLE_RATE = 1
# DDP's running averages over its timed iterations, and the per-window field each becomes.
DDP_TIMES = (
    ("forward_compute_time", "forward_s"),
    ("backward_compute_time", "backward_s"),
    ("backward_comm_time", "comm_s"),
    ("backward_compute_comm_overlap_time", "overlap_s"),
)


def _percentile(ordered: list[float], q: float) -> float:
    index = min(int(q * len(ordered)), len(ordered) - 1)
    return ordered[index]


class Reporter:
    """One per process; ``gputop.watch()`` creates and starts it."""

    def __init__(self, address: Address, *, window_s: float = DEFAULT_WINDOW_S) -> None:
        self.window_s = window_s
        self.clock = StepClock()
        self.sender = Sender(address, backlog_frames=max(int(BACKLOG_S / window_s), 16))
        self.pid = os.getpid()
        self.started_t = time.time()
        self._facts: dict[str, Any] = {}
        self._hello: Hello | None = None
        self._model: Any = None
        self._ddp_model: Any = None
        self._hook_handles: list[Any] = []
        self._primary_optimizer: int | None = None
        self.manual_steps = False
        self._seq = 0
        self._step_total = 0
        self._pending_events: list[Any] = []  # CUDA events not yet complete
        self._last_event: Any = None
        # (iteration, running averages) at the last read, while every iteration is timed
        # from the first: then average x iteration is a running total, and the
        # difference between two reads is the window's total.
        self._ddp_totals_from: tuple[int, dict[str, float]] | None = None
        self._memory_on = False
        self._process: Any = None
        self._children: dict[int, Any] = {}
        self._failed_probes: set[str] = set()
        self._forward_calls = 0
        self._clock_errors_reported = 0
        self._refusal_said = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gputop-reporter", daemon=True)
        self._facts_changed = threading.Event()

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
        self._facts.update(facts.model_facts(model))
        self._facts.update(facts.device_facts(self._facts.get("device")))
        self._facts.update(facts.identity())  # the process group may exist by now
        if self._facts.get("ddp"):
            self._ddp_model = model
            on_cpu = str(self._facts.get("device", "cpu")).startswith("cpu")
            default = CPU_DDP_SAMPLE_RATE if on_cpu else DEFAULT_DDP_SAMPLE_RATE
            try:
                rate = max(int(os.environ.get("GPUTOP_DDP_SAMPLE_RATE", default)), 1)
                model._set_ddp_runtime_logging_sample_rate(rate)
                if rate == 1 and model._get_ddp_logging_data().get("iteration", 0) == 0:
                    self._ddp_totals_from = (0, {})
            except Exception:
                self._failed_probes.add("ddp_sample_rate")
        device = str(self._facts.get("device", ""))
        if device.startswith("cuda"):
            self._memory_on = True
            if os.environ.get("GPUTOP_CUDA_EVENTS", "1") != "0":
                try:
                    import torch

                    self.clock.event_factory = lambda: torch.cuda.Event(enable_timing=True)
                except Exception:
                    pass
        with contextlib.suppress(Exception):
            self._hook_handles.append(model.register_forward_pre_hook(self._on_forward))
        self._facts_changed.set()

    def attach_loader(self, loader: Any) -> None:
        self._facts.update(facts.loader_facts(loader))
        self._facts_changed.set()

    def mark_step(self) -> None:
        """``gputop.step()``: from now on only manual marks count as steps."""
        self.manual_steps = True
        self.clock.mark_step()

    def _install_step_hook(self) -> None:
        optim: Any = sys.modules.get("torch.optim.optimizer")
        if optim is None:
            try:
                import torch.optim.optimizer as optim
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
            self.clock.mark_step()

    def _on_forward(self, module: Any, args: Any) -> None:
        # Autocast is thread-local and only visible around forward: look now and then.
        self._forward_calls += 1
        if self._forward_calls % 50 != 1:
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
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(EXIT_FLUSH_S + 0.5)
        for handle in self._hook_handles:
            with contextlib.suppress(Exception):
                handle.remove()

    # -- reporter thread ------------------------------------------------------------

    def _run(self) -> None:
        next_window_s = time.monotonic() + self.window_s
        window_t0 = time.time()
        while not self._stop.wait(TICK_S):
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
                self.sender.pump(now)
            except Exception as exc:  # a bug here must not end reporting for the run
                self._report_error("reporter", exc)
        self._final_flush(window_t0)

    def _final_flush(self, window_t0: float) -> None:
        try:
            self._close_window(window_t0)
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
            self.sender.close()
        except Exception:
            pass

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

    def _close_window(self, t0: float) -> float:
        """Build and enqueue the window that ends now; return its end time."""
        t1 = time.time()
        marks = self.clock.drain()
        hello = self._hello_or_new()
        timed = [m for m in marks if m.duration_s is not None]
        durations = sorted(m.duration_s for m in timed if m.duration_s is not None)
        hist: dict[int, int] = {}
        for d in durations:
            bucket = hist_bucket(d)
            hist[bucket] = hist.get(bucket, 0) + 1
        self._step_total += len(marks)
        batch_size = self._facts.get("loader_batch_size")
        batches = sum(m.batches for m in marks)
        fields: dict[str, Any] = {
            "steps": len(marks),
            "timed_steps": len(durations),
            "step_total": self._step_total,
            "step_time_sum_s": sum(durations),
            "step_hist": hist,
            "loader_wait_s": sum(m.loader_wait_s for m in timed),
            "loader_batches": batches,
            "dropped": self.sender.dropped,
        }
        if durations:
            fields["step_time_p50_s"] = _percentile(durations, 0.5)
            fields["step_time_p95_s"] = _percentile(durations, 0.95)
            fields["step_time_max_s"] = durations[-1]
        if batch_size and batches:
            fields["samples"] = batches * int(batch_size)
        for probe in (self._gpu_step_times, self._ddp_stats, self._memory, self._cpu):
            try:
                fields.update(probe(marks))
            except Exception as exc:
                self._report_error(probe.__name__.lstrip("_"), exc)
        if self.clock.errors > self._clock_errors_reported:
            self._clock_errors_reported = self.clock.errors
            self._report_error("step_mark", RuntimeError(f"{self.clock.errors} step mark(s) failed; CUDA events off"))
        if self.sender.refused and not self._refusal_said:
            self._refusal_said = True
            sys.stderr.write(f"gputop: not reporting: {self.sender.refused}\n")
        self._seq += 1
        window = Window(run_id=hello.run_id, rank=hello.rank, seq=self._seq, t0=t0, t1=t1, **fields)
        self.sender.enqueue(encode(window))
        return t1

    def _gpu_step_times(self, marks: list[StepMark]) -> dict[str, Any]:
        """Elapsed GPU time between consecutive step marks whose events have completed."""
        self._pending_events.extend(m.cuda_event for m in marks if m.cuda_event is not None)
        gpu_times = []
        while self._pending_events and self._pending_events[0].query():
            event = self._pending_events.pop(0)
            if self._last_event is not None:
                gpu_times.append(self._last_event.elapsed_time(event) / 1000.0)
            self._last_event = event
        if len(self._pending_events) > 10_000:  # a stream that never completes; stop holding events
            self._pending_events.clear()
        if not gpu_times:
            return {}
        gpu_times.sort()
        return {"gpu_step_time_p50_s": _percentile(gpu_times, 0.5)}

    def _ddp_stats(self, marks: list[StepMark]) -> dict[str, Any]:
        """DDP's runtime logging data (private API, read defensively; ns -> s).

        When DDP times every iteration, the window gets the mean over its own
        iterations; otherwise the latest sampled iteration stands for them.
        """
        model = self._ddp_model
        if model is None:
            return {}
        data = model._get_ddp_logging_data()
        if not isinstance(data, dict) or "iteration" not in data:
            return {}
        iteration = int(data["iteration"])
        if self._ddp_totals_from is not None:
            means = self._ddp_window_means(data, iteration, *self._ddp_totals_from)
            if means is not None:
                return means
        out: dict[str, Any] = {"ddp_iteration": iteration}
        for key, name in DDP_TIMES:
            value = data.get(key)
            if isinstance(value, (int, float)) and value >= 0:
                out[name] = value / 1e9
        return out if "comm_s" in out else {}

    def _ddp_window_means(
        self, data: dict[str, Any], iteration: int, since: int, before: dict[str, float]
    ) -> dict[str, Any] | None:
        """Per-iteration means since the last read, from DDP's running averages.

        None when they do not add up (an iteration DDP could not time, e.g.
        under no_sync): the reporter then falls back to the latest sample for good.
        """
        if iteration == since:
            return {}  # no iteration finished: no DDP figures in this window
        raw = {name: data.get("avg_" + key) for key, name in DDP_TIMES}
        if iteration < since or not all(isinstance(v, (int, float)) for v in raw.values()):
            self._ddp_totals_from = None
            return None
        averages = {name: float(v) for name, v in raw.items()}  # type: ignore[arg-type]
        steps = iteration - since
        out: dict[str, Any] = {"ddp_iteration": iteration, "ddp_steps": steps}
        for name, average in averages.items():
            mean = (average * iteration - before.get(name, 0.0) * since) / steps / 1e9
            if not 0.0 <= mean < 3600.0:
                self._ddp_totals_from = None
                return None
            out[name] = mean
        if out["overlap_s"] > out["comm_s"] + 1e-6:
            self._ddp_totals_from = None
            return None
        self._ddp_totals_from = (iteration, averages)
        return out

    def _memory(self, marks: list[StepMark]) -> dict[str, Any]:
        if not self._memory_on:
            return {}
        import torch

        if not torch.cuda.is_initialized():
            return {}
        index = torch.device(self._facts.get("device", "cuda")).index
        stats = torch.cuda.memory_stats(index)
        return {
            "mem_allocated_bytes": int(stats.get("allocated_bytes.all.current", 0)),
            "mem_reserved_bytes": int(stats.get("reserved_bytes.all.current", 0)),
            "mem_peak_bytes": int(stats.get("allocated_bytes.all.peak", 0)),
            "alloc_retries": int(stats.get("num_alloc_retries", 0)),
            "ooms": int(stats.get("num_ooms", 0)),
            **({"mem_total_bytes": self._facts["device_total_bytes"]} if self._facts.get("device_total_bytes") else {}),
        }

    def _cpu(self, marks: list[StepMark]) -> dict[str, Any]:
        """CPU and RSS of this process and its children (DataLoader workers)."""
        import psutil

        first = self._process is None
        if first:
            self._process = psutil.Process()
        proc = self._process
        with proc.oneshot():
            cpu_pct = proc.cpu_percent(None)  # the first call only sets the baseline
            out: dict[str, Any] = {"rss_bytes": proc.memory_info().rss, "threads": proc.num_threads()}
        if not first:
            out["cpu_pct"] = cpu_pct
        children = {c.pid: c for c in proc.children(recursive=False)}
        worker_cpu = 0.0
        for pid, child in children.items():
            known = self._children.get(pid)
            try:
                if known is None:
                    child.cpu_percent(None)
                    self._children[pid] = child
                else:
                    worker_cpu += known.cpu_percent(None)
            except psutil.Error:
                pass
        for pid in set(self._children) - set(children):
            del self._children[pid]
        out["workers"] = len(children)
        if children:
            out["workers_cpu_pct"] = worker_cpu
        return out
