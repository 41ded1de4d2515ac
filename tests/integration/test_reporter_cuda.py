"""Which device each CUDA call of the reporter names, and on which device the calling thread is at the time.

No GPU here: ``FakeCuda`` has the names the reporter uses of ``torch.cuda``
and keeps a current device per thread as the CUDA runtime does (every thread
starts on device 0; ``set_device`` and ``device(i)`` change it for the calling
thread only).  It records every call: making an event, recording it (and on
which device's stream), querying it, timing it, destroying it (its last
reference dropped), reading memory counters.  A call made while device 0 is
current on a thread that never chose a device is the call that makes a CUDA
context on GPU 0 in every rank (torchcomms PR #777).

The real reporter thread runs; the test's own thread plays the training
thread of a script that did ``model.to(3)`` without ``torch.cuda.set_device``.
"""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest

from gputop.reporter.rank_cuda import RankCuda, model_cuda_index
from gputop.reporter.reporter import Reporter
from tests.support.collectors import snapshot_of, wait_for
from tests.support.sim_cuda import DeviceScope

torch = pytest.importorskip("torch")  # the reporter watches a real module; only its CUDA is faked

GPU_LAG_S = 0.03  # how long after it is recorded the fake GPU reaches an event


@dataclass(frozen=True)
class Call:
    """One call into the fake ``torch.cuda``."""

    what: str  # "Event", "current_stream", "record", "query", "elapsed_time", "destroy", "memory_stats"
    thread: str  # the calling thread's name
    current: int  # the device current on the calling thread when it called
    names: int | None  # the device the call is about: the stream's, the event's, the argument's


class FakeStream:
    def __init__(self, device: int) -> None:
        self.device = device


class FakeEvent:
    """Like ``torch.cuda.Event``: made lazily, on the device of the stream it is first recorded on."""

    def __init__(self, cuda: FakeCuda) -> None:
        self._cuda = cuda
        self.device: int | None = None
        self.recorded_s = 0.0

    def record(self, stream: FakeStream | None = None) -> None:
        stream = stream if stream is not None else self._cuda.current_stream()  # torch: the current device's stream
        self.device = stream.device
        self.recorded_s = time.perf_counter()
        self._cuda.log("record", stream.device)

    def query(self) -> bool:
        self._cuda.log("query", self.device)
        return time.perf_counter() - self.recorded_s >= GPU_LAG_S

    def elapsed_time(self, end: FakeEvent) -> float:
        self._cuda.log("elapsed_time", self.device)
        if self._cuda.fail_elapsed_time:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return (end.recorded_s - self.recorded_s) * 1000.0

    def __del__(self) -> None:
        if self.device is not None:  # torch destroys only events that were made
            self._cuda.log("destroy", self.device)


class FakeCuda:
    """The names the reporter uses of ``torch.cuda``, recording each call with the device current on its thread."""

    def __init__(self, *, initialized: bool = True) -> None:
        self.calls: list[Call] = []  # list.append is atomic: both threads log here
        self.initialized = initialized
        self.fail_elapsed_time = False
        self._threads = threading.local()

    def log(self, what: str, names: int | None) -> None:
        self.calls.append(Call(what, threading.current_thread().name, self.current_device(), names))

    def is_initialized(self) -> bool:
        return self.initialized

    def current_device(self) -> int:
        return int(getattr(self._threads, "device", 0))  # a thread that never chose one is on device 0

    def set_device(self, index: int) -> None:
        self._threads.device = index

    def device(self, index: int) -> DeviceScope:
        return DeviceScope(self, index)

    def current_stream(self, device: int | None = None) -> FakeStream:
        index = self.current_device() if device is None else device
        self.log("current_stream", index)
        return FakeStream(index)

    def Event(self, enable_timing: bool = False) -> FakeEvent:
        self.log("Event", None)
        return FakeEvent(self)

    def memory_stats(self, device: int | None = None) -> dict[str, int]:
        self.log("memory_stats", self.current_device() if device is None else device)
        return {"allocated_bytes.all.current": 3 << 20, "reserved_bytes.all.current": 4 << 20}

    def of(self, *what: str) -> list[Call]:
        return [c for c in self.calls if c.what in what]


class Parameter:
    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self.dtype = torch.float32

    def numel(self) -> int:
        return 1024


class Model:
    """A module's parameters, placed on whatever devices a test says (none of them real here)."""

    def __init__(self, *devices: str) -> None:
        self._parameters = [Parameter(d) for d in devices]

    def parameters(self) -> Any:
        return iter(self._parameters)


def train(reporter: Reporter, cuda: FakeCuda, model: Model, steps: int = 60) -> int:
    """Watch ``model`` and step from a fresh thread that never calls set_device; return its device afterwards."""
    after: list[int] = []

    def loop() -> None:
        reporter.attach_model(model)
        for _ in range(steps):
            reporter.mark_step()
            time.sleep(0.02)
        after.append(cuda.current_device())

    thread = threading.Thread(target=loop, name="training")
    thread.start()
    thread.join(30)
    return after[0]


@pytest.fixture
def started() -> Any:
    """Reporters started by a test, shut down after it even when it fails."""
    reporters: list[Reporter] = []
    yield reporters
    for reporter in reporters:
        reporter.shutdown()


def test_every_cuda_call_is_made_on_the_models_device_though_the_script_never_chose_it(collector, started) -> None:
    cuda = FakeCuda()
    reporter = Reporter(collector.address, window_s=0.25, cuda=cuda)
    started.append(reporter)
    reporter.start()
    device_after = train(reporter, cuda, Model("cuda:3", "cuda:3"))
    reporter.shutdown()  # the last window, then the events are dropped on the reporter thread
    gc.collect()

    records = cuda.of("record")
    # Two events a step mark, the GPU step time's and the phase timeline's, both on device 3's stream, not 0's.
    assert len(records) == 120 and {c.names for c in records} == {3}
    assert {c.thread for c in records} == {"training"}
    harvest = cuda.of("query", "elapsed_time", "destroy", "memory_stats")
    assert {c.thread for c in harvest} == {"gputop-reporter"}
    assert {(c.current, c.names) for c in harvest} == {(3, 3)}
    assert len(cuda.of("elapsed_time")) >= 40 and cuda.of("memory_stats")
    assert len(cuda.of("destroy")) == len(cuda.of("Event"))  # every event made was dropped, in scope
    assert [c for c in cuda.calls if c.current != 3] == []  # no call of any kind with another device current
    assert device_after == 0  # the training thread is back on the device the script left it on

    windows = [w for v in snapshot_of(collector).all_ranks() for w in v.windows]
    gpu_p50s = [w.gpu_step_time_p50_s for w in windows if w.gpu_step_time_p50_s is not None]
    assert gpu_p50s and all(0.015 < p < 1.0 for p in gpu_p50s)  # steps are 20 ms of sleep apart
    assert any(w.mem_allocated_bytes == 3 << 20 for w in windows)


@pytest.mark.parametrize(
    ("devices", "initialized", "reason"),
    [
        (("cuda:0", "cuda:1"), True, "gpu_step_times: the model's parameters are on cuda:0 and cuda:1"),
        (("cpu", "cpu"), True, "gpu_step_times: the model's parameters are on cpu while this process uses CUDA"),
        ((), True, "gpu_step_times: the watched model has no parameters"),
    ],
    ids=["two-gpus", "cpu-params-cuda-process", "no-parameters"],
)
def test_gpu_step_time_is_off_with_its_reason_on_the_wire_when_the_device_cannot_be_told(
    collector, started, devices: tuple[str, ...], initialized: bool, reason: str
) -> None:
    cuda = FakeCuda(initialized=initialized)
    reporter = Reporter(collector.address, window_s=0.25, cuda=cuda)
    started.append(reporter)
    reporter.start()
    train(reporter, cuda, Model(*devices), steps=20)

    def said() -> list[str]:
        return [e.message for v in snapshot_of(collector).all_ranks() for e in v.events if e.kind == "not_measured"]

    assert wait_for(lambda: any(m.startswith(reason) for m in said()))
    if devices and devices[0].startswith("cuda"):  # read as a model on CUDA: its phases say why they are N/A too
        assert wait_for(lambda: len(said()) == 2)
        assert any(m.startswith("cuda_phases: ") and reason.split(": ", 1)[1] in m for m in said()), said()
    else:
        assert len(said()) == 1, said()
    reporter.shutdown()
    assert cuda.of("Event", "record", "query", "elapsed_time") == []  # nothing timed on a guessed device
    assert all(w.gpu_step_time_p50_s is None for v in snapshot_of(collector).all_ranks() for w in v.windows)


def test_a_cpu_run_has_nothing_to_explain() -> None:
    assert model_cuda_index(torch.nn.Linear(2, 2), cuda_in_use=False) == (None, None)
    index, why = model_cuda_index(torch.nn.Linear(2, 2), cuda_in_use=True)
    assert index is None and why is not None and "cpu" in why
    assert model_cuda_index(Model("cuda:2", "cuda:2"), cuda_in_use=True) == (2, None)


def test_an_event_that_fails_is_still_dropped_with_its_device_current() -> None:
    """A failure's traceback holds the event being handled: it must not carry the event out of the scope."""
    cuda = FakeCuda()
    device = RankCuda(3, cuda)
    device.record_step()
    device.record_step()
    time.sleep(GPU_LAG_S * 2)
    cuda.fail_elapsed_time = True
    with pytest.raises(RuntimeError, match="illegal memory access"):
        device.step_times_s()
    gc.collect()
    device.release()
    gc.collect()
    assert len(cuda.of("destroy")) == 2
    assert [c for c in cuda.calls if c.current != 3] == []


class OnGpu3(torch.nn.Module):  # type: ignore[name-defined]
    """A real module, with real hooks and a real optimizer, whose parameters read as being on cuda:3."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def parameters(self, recurse: bool = True) -> Any:
        return iter([Parameter("cuda:3")])

    def forward(self, x: Any) -> Any:
        time.sleep(0.004)  # stands for the forward's kernels: the fake GPU reaches each event when the host does
        return self.linear(x)


def test_a_model_on_one_gpu_off_ddp_gets_its_phases_from_cuda_events_on_its_device(collector, started) -> None:
    cuda = FakeCuda()
    reporter = Reporter(collector.address, window_s=0.25, cuda=cuda)
    started.append(reporter)
    reporter.start()
    model = OnGpu3()
    optimizer = torch.optim.SGD(model.linear.parameters(), lr=0.01)

    def loop() -> None:
        reporter.attach_model(model)
        for _ in range(40):
            loss = model(torch.ones(2, 4)).sum()
            time.sleep(0.008)  # the backward's kernels
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    thread = threading.Thread(target=loop, name="training")
    thread.start()
    thread.join(30)
    reporter.shutdown()
    gc.collect()

    windows = [w for v in snapshot_of(collector).all_ranks() for w in v.windows if w.phases_from is not None]
    assert windows and {w.phases_from for w in windows} == {"cuda events"}
    assert all(0.003 < (w.forward_s or 0) < 0.05 and 0.007 < (w.backward_s or 0) < 0.1 for w in windows), windows
    assert [c for c in cuda.calls if c.current != 3] == []  # hooks, optimizer marks, harvest, exit: all on GPU 3
    assert {c.thread for c in cuda.of("query", "elapsed_time", "destroy")} == {"gputop-reporter"}
    assert len(cuda.of("destroy")) == len(cuda.of("Event"))


def test_cuda_events_off_leaves_the_phases_on_cuda_na_with_the_reason(collector, started, monkeypatch) -> None:
    monkeypatch.setenv("GPUTOP_CUDA_EVENTS", "0")
    cuda = FakeCuda()
    reporter = Reporter(collector.address, window_s=0.25, cuda=cuda)
    started.append(reporter)
    reporter.start()
    train(reporter, cuda, Model("cuda:3"), steps=20)

    def said() -> list[str]:
        return [e.message for v in snapshot_of(collector).all_ranks() for e in v.events if e.kind == "not_measured"]

    off = "cuda_phases: CUDA events are off (GPUTOP_CUDA_EVENTS=0)"
    assert wait_for(lambda: any(m.startswith(off) for m in said()))
    reporter.shutdown()
    assert cuda.of("Event", "record") == []
    assert all(w.phases_from is None for v in snapshot_of(collector).all_ranks() for w in v.windows)
