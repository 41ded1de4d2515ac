"""DDP's own timings of forward, backward, gradient exchange and its overlap with backward.

Read from ``_get_ddp_logging_data()``, a private PyTorch API, defensively: a
missing key or a changed name leaves the figures out (N/A), never raises into
training.  DDP times every Nth iteration; how N is chosen, and why every
iteration is timed on CPU, is in docs/architecture.md ("DDP statistics").

Zero is not a measurement here.  At each sampled iteration DDP's logger sets
the four times to 0 and then fills each one it can time; it leaves them all at
0 for a CUDA module on several devices, for a device that is neither CPU nor
CUDA, and a time stays 0 when its timer has no usable pair of events (c10d
``Logger::reset_performance_stats`` / ``Logger::set_runtime_stats_and_log``,
``CudaTimer::measureDifference``).  A real iteration's forward and backward
never take 0 ns, so all four at 0 means "DDP did not time this", and the
window says so instead of reporting "exposed comm 0 ms".

DDP's backward starts at its forward's end: the reducer records
``kBackwardComputeStart`` in ``prepare_for_backward``, which DDP's forward
calls on its way out.  Whatever the script runs between ``model(x)`` and
``loss.backward()`` (a loss or a metric in Python, a log line) is in DDP's
backward.  On the CPU the probe takes it out: the mean gap between a
synchronising forward's end and its backward's start, as the clock's autograd
pre-hook measured it over the same iterations (``StepClock.pre_backward``),
leaves DDP's backward for the step's "other".
"""

from __future__ import annotations

from typing import Any

from gputop import settings
from gputop.reporter.bounded import BoundedCall, Busy
from gputop.reporter.clock import StepClock, StepMark

# DDP times forward/backward/comm on every Nth iteration (PyTorch's default is
# 100).  On CUDA each timed iteration's events are synchronised on the training
# thread at the next forward (c10d's CudaTimer::measureDifference): gputop leaves
# DDP's rate as it is there, and adds no such wait.  On the CPU the timer is two
# clock reads, so every iteration is timed.
CPU_DDP_SAMPLE_RATE = settings.DDP_SAMPLE_RATE_CPU
# DDP's running averages over its timed iterations (ns), and the window field each becomes.
DDP_TIMES = (
    ("forward_compute_time", "forward_s"),
    ("backward_compute_time", "backward_s"),
    ("backward_comm_time", "comm_s"),
    ("backward_compute_comm_overlap_time", "overlap_s"),
)
_NS = 1e9
# DDP knows what find_unused_parameters found, and its final buckets, after the
# first iterations (it rebuilds the buckets in gradient order after the first).
SETTLED_ITERATIONS = 2
# Why the DDP figures are N/A although DDP runs, as the not_measured event says it.
MULTI_DEVICE = "DDP does not time a module spread over several devices (it logs zeros)"
ALL_ZERO = "DDP logged all-zero times: it had no usable timing events for its sampled iterations"
BUSY = "DDP's logger waits for its reducer, in an exchange that has not ended (a peer that never joined?)"
# The most the reporter thread waits for DDP's logging data (gputop/reporter/bounded.py); a read that takes
# longer is skipped, its window without DDP's figures, and the next read waits for it to have returned.
READ_BOUND_S = 0.2
NO_LOGGING_DATA = "this torch's DDP has no _get_ddp_logging_data(), the private API its timings are read from"
UNREADABLE = "DDP's _get_ddp_logging_data() is not the dict of counters this gputop reads (a private API that changed)"


def ddp_settings(data: dict[str, Any]) -> dict[str, Any]:
    """Hello facts from DDP's logging data; a key missing or of another type is left out."""

    def flag(key: str) -> bool | None:
        value = data.get(key)
        return bool(value) if isinstance(value, int) else None

    def size(key: str) -> int | None:
        value = data.get(key)
        return int(value) if isinstance(value, int) and value >= 0 else None

    # After its first iteration DDP rebuilds the buckets in the order gradients became ready:
    # the construction-time layout (bucket_sizes) is often a single bucket, the rebuilt one is what runs.
    buckets = data.get("rebuilt_bucket_sizes") if data.get("has_rebuilt_buckets") else None
    buckets = buckets if isinstance(buckets, str) and buckets.strip() else data.get("bucket_sizes")
    facts = {
        "ddp_find_unused_parameters": flag("find_unused_parameters"),
        "ddp_unused_parameter_bytes": size("unused_parameter_size"),
        "ddp_static_graph": flag("static_graph"),
        "ddp_gradient_as_bucket_view": flag("gradient_as_bucket_view"),
        "ddp_bucket_cap_bytes": size("bucket_cap_bytes"),
        "ddp_buckets": len([b for b in buckets.split(",") if b.strip()]) if isinstance(buckets, str) else None,
        "ddp_gradient_bytes": size("total_parameter_size_bytes"),
    }
    return {k: v for k, v in facts.items() if v is not None}


class DdpProbe:
    """Per-window DDP figures: the mean over the window's iterations when every one is timed."""

    name = "ddp_stats"

    def __init__(self, model: Any, *, on_cpu: bool, clock: StepClock | None = None) -> None:
        """Set DDP's sample rate on ``model`` (a DistributedDataParallel).

        If DDP refuses (a private API that changed), ``rate_error`` says why and
        the probe still reads whatever DDP samples at its own rate.  ``clock``:
        the training thread's, whose forward-to-backward gaps leave DDP's
        backward on the CPU (``_less_pre_backward``); None leaves it as DDP logs it.
        """
        self.model = model
        # Only on the CPU.  There DDP's timer reads the host clock at its forward's end and when the backward's last
        # gradient is ready, and the engine runs the backward on the thread that called backward(): the gap the
        # clock's pre-hook measures (same clock, same thread) is inside DDP's backward exactly.  On CUDA DDP times
        # the span with CUDA events on the stream, GPU time: the GPU is still running the forward's queued kernels
        # while the CPU runs the script's code, so a CPU gap is not time the GPU spent outside the backward.
        self._gaps = clock if on_cpu else None
        self._gaps_read = clock.pre_backward if clock is not None else (0.0, 0)
        # (iteration, running averages) at the last read, while every iteration is
        # timed from the first: then average x iteration is a running total, and
        # the difference between two reads is the window's own total.
        self._totals_from: tuple[int, dict[str, float]] | None = None
        self.rate_error: Exception | None = None
        self._reads = BoundedCall("gputop-ddp-read", READ_BOUND_S)
        self.not_measured: str | None = None  # why the latest read had no figures although DDP ran
        self.settings: dict[str, Any] | None = None  # Hello facts: how DDP was built, read once it has settled
        try:
            chosen = settings.DDP_SAMPLE_RATE.value()
            # None: DDP's own rate (CUDA), never set
            self.sample_rate: int | None = chosen or (CPU_DDP_SAMPLE_RATE if on_cpu else None)
            if self.sample_rate is not None:
                model._set_ddp_runtime_logging_sample_rate(self.sample_rate)
            if self.sample_rate == 1 and model._get_ddp_logging_data().get("iteration", 0) == 0:
                self._totals_from = (0, {})
        except Exception as exc:
            self.rate_error = exc

    @property
    def averaging(self) -> bool:
        """Whether windows get means over their iterations (else DDP's latest sample)."""
        return self._totals_from is not None

    def read(self, marks: list[StepMark]) -> dict[str, Any]:
        logging_data = getattr(self.model, "_get_ddp_logging_data", None)
        if logging_data is None:
            self.not_measured = NO_LOGGING_DATA
            return {}
        try:  # it takes the reducer's lock, held while DDP's backward waits for its all-reduce: never wait on it
            data = self._reads.call(logging_data)
        except Busy:
            self.not_measured = BUSY
            return {}
        if not isinstance(data, dict) or not isinstance(data.get("iteration"), int):
            self.not_measured = UNREADABLE
            return {}
        iteration = int(data["iteration"])
        if self.settings is None and iteration >= SETTLED_ITERATIONS:
            self.settings = ddp_settings(data)
            hooks = getattr(self.model, "_comm_hooks", None)  # the Python comm hooks (not the built-in C++ ones)
            if isinstance(hooks, list):
                self.settings["ddp_python_comm_hook"] = bool(hooks)
        if data.get("is_multi_device_module"):
            self.not_measured = MULTI_DEVICE
            return {}
        if self._totals_from is not None:
            means = self._window_means(data, iteration, *self._totals_from)
            if means is not None:
                return means
        out: dict[str, Any] = {"ddp_iteration": iteration}
        for key, name in DDP_TIMES:
            value = data.get(key)
            if isinstance(value, (int, float)) and value >= 0:
                out[name] = value / _NS
        if "comm_s" not in out:
            return {}
        return self._unless_all_zero(out)

    def _unless_all_zero(self, out: dict[str, Any]) -> dict[str, Any]:
        """The figures, or {} when all of DDP's times are 0: DDP did not time the iteration(s)."""
        if any(out.get(name) for _, name in DDP_TIMES):
            self.not_measured = None
            return {**self._less_pre_backward(out), "phases_from": "ddp"}
        self.not_measured = ALL_ZERO
        return {}

    def _less_pre_backward(self, out: dict[str, Any]) -> dict[str, Any]:
        """DDP's backward less the mean gap between a forward's end and its backward's start since the last read.

        Both cover the same iterations: those since the last read (the clock hooks only the forwards that
        synchronise, the ones DDP times).  Clamped at 0: a gap is never more than DDP's own span, which holds it,
        but the two reads are a moment apart.  Untouched where no backward's start was seen (an older torch, an
        output the loss does not use): as DDP logs it.
        """
        if self._gaps is None:
            return out
        (total, count), (before, counted) = self._gaps.pre_backward, self._gaps_read
        self._gaps_read = (total, count)
        backward = out.get("backward_s")
        if count <= counted or backward is None:
            return out
        return {**out, "backward_s": max(backward - (total - before) / (count - counted), 0.0)}

    def _window_means(
        self, data: dict[str, Any], iteration: int, since: int, before: dict[str, float]
    ) -> dict[str, Any] | None:
        """Per-iteration means since the last read, from DDP's running averages.

        None when they do not add up (an iteration DDP could not time, e.g.
        under no_sync): the probe then falls back to the latest sample for good.
        """
        if iteration == since:
            return {}  # no iteration finished: no DDP figures in this window
        raw = {name: data.get("avg_" + key) for key, name in DDP_TIMES}
        if iteration < since or not all(isinstance(v, (int, float)) for v in raw.values()):
            self._totals_from = None
            return None
        averages = {name: float(v) for name, v in raw.items()}  # type: ignore[arg-type]
        steps = iteration - since
        out: dict[str, Any] = {"ddp_iteration": iteration, "ddp_steps": steps}
        for name, average in averages.items():
            mean = (average * iteration - before.get(name, 0.0) * since) / steps / _NS
            if not 0.0 <= mean < 3600.0:
                self._totals_from = None
                return None
            out[name] = mean
        if out["overlap_s"] > out["comm_s"] + 1e-6:
            self._totals_from = None
            return None
        self._totals_from = (iteration, averages)
        return self._unless_all_zero(out)
