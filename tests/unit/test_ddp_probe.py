"""The DDP probe's arithmetic on its own: per-window means from DDP's running averages, and its fallbacks.

The figures DDP really logs are checked against a real 2-rank job in
tests/integration/test_ddp_integration.py; here a stand-in logging-data source
drives every case, including the ones a real job rarely shows (an untimed
iteration, a model watched late, a torch whose private API is gone).
"""

from __future__ import annotations

from typing import Any

import pytest

from gputop.collect.store import Store
from gputop.model.sums import rank_stats
from gputop.protocol import Event, Hello
from gputop.reporter.probes.ddp import (
    CPU_DDP_SAMPLE_RATE,
    NO_LOGGING_DATA,
    UNREADABLE,
    DdpProbe,
    ddp_settings,
)
from gputop.tui.na import na_reasons

MS = 1e6  # DDP logs nanoseconds


class LoggingData:
    """What ``DistributedDataParallel`` exposes: a sample rate to set, and running averages of timed iterations.

    Like DDP's reducer, ``avg_*`` are means over every timed iteration so far
    and the plain keys are the latest timed iteration.
    """

    def __init__(self, iteration: int = 0) -> None:
        self.sample_rate: int | None = None
        self.iteration = iteration
        self.timed = 0
        self.latest: dict[str, float] = {}
        self.sums = {"forward": 0.0, "backward": 0.0, "comm": 0.0, "overlap": 0.0}

    def _set_ddp_runtime_logging_sample_rate(self, rate: int) -> None:
        self.sample_rate = rate

    def step(self, forward_ms: float, backward_ms: float, comm_ms: float, overlap_ms: float) -> None:
        self.iteration += 1
        self.timed += 1
        self.latest = {"forward": forward_ms * MS, "backward": backward_ms * MS, "comm": comm_ms * MS,
                       "overlap": overlap_ms * MS}  # fmt: skip
        for key, value in self.latest.items():
            self.sums[key] += value

    def _get_ddp_logging_data(self) -> dict[str, Any]:
        names = {
            "forward": "forward_compute_time",
            "backward": "backward_compute_time",
            "comm": "backward_comm_time",
            "overlap": "backward_compute_comm_overlap_time",
        }
        data: dict[str, Any] = {"iteration": self.iteration}
        for key, name in names.items():
            if self.timed:
                data[name] = self.latest[key]
                data["avg_" + name] = self.sums[key] / self.timed
        return data


@pytest.fixture(autouse=True)
def no_rate_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUTOP_DDP_SAMPLE_RATE", raising=False)


def test_each_window_gets_the_mean_of_its_own_iterations() -> None:
    ddp = LoggingData()
    probe = DdpProbe(ddp, on_cpu=True)
    assert ddp.sample_rate == CPU_DDP_SAMPLE_RATE and probe.averaging
    for _ in range(3):
        ddp.step(10, 20, 8, 6)
    first = probe.read([])
    ddp.step(30, 40, 12, 2)
    second = probe.read([])
    assert first["ddp_steps"] == 3 and first["ddp_iteration"] == 3
    assert first["forward_s"] == pytest.approx(0.010) and first["overlap_s"] == pytest.approx(0.006)
    assert second["ddp_steps"] == 1 and second["ddp_iteration"] == 4
    assert second["forward_s"] == pytest.approx(0.030) and second["comm_s"] == pytest.approx(0.012)


def test_a_window_without_an_iteration_has_no_ddp_figures() -> None:
    ddp = LoggingData()
    probe = DdpProbe(ddp, on_cpu=True)
    ddp.step(10, 20, 8, 6)
    probe.read([])
    assert probe.read([]) == {}


def test_totals_that_do_not_add_up_fall_back_to_the_latest_sample_for_good() -> None:
    ddp = LoggingData()
    probe = DdpProbe(ddp, on_cpu=True)
    ddp.step(10, 20, 8, 6)
    probe.read([])
    ddp.iteration += 1  # an iteration DDP counted but could not time
    ddp.step(10, 20, 8, 20)  # and averages whose overlap now exceeds comm
    fallback = probe.read([])
    assert not probe.averaging
    assert "ddp_steps" not in fallback and fallback["overlap_s"] == pytest.approx(0.020)
    ddp.step(11, 20, 8, 6)
    assert probe.read([])["forward_s"] == pytest.approx(0.011)  # still the latest sample


def test_a_model_watched_after_its_first_iteration_reports_the_latest_sample() -> None:
    ddp = LoggingData(iteration=5)  # the running averages already cover iterations gputop never saw
    probe = DdpProbe(ddp, on_cpu=True)
    assert not probe.averaging
    ddp.step(10, 20, 8, 6)
    assert probe.read([])["ddp_iteration"] == 6


def test_a_cuda_models_ddp_keeps_its_own_sample_rate_unless_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each iteration DDP times on CUDA it synchronises that iteration's events on the training thread at the next
    forward: a rate of gputop's choosing would add waits to the training thread."""
    monkeypatch.delenv("GPUTOP_DDP_SAMPLE_RATE", raising=False)
    ddp = LoggingData()
    probe = DdpProbe(ddp, on_cpu=False)
    assert not probe.averaging and ddp.sample_rate is None and probe.sample_rate is None  # never set
    monkeypatch.setenv("GPUTOP_DDP_SAMPLE_RATE", "10")
    DdpProbe(ddp, on_cpu=False)
    assert ddp.sample_rate == 10  # the user's choice stands
    monkeypatch.setenv("GPUTOP_DDP_SAMPLE_RATE", "100")
    DdpProbe(ddp, on_cpu=True)
    assert ddp.sample_rate == 100


def test_logging_data_without_timings_gives_nothing() -> None:
    ddp = LoggingData()
    ddp.iteration = 3  # iterations, but none timed yet (no avg_ keys)
    probe = DdpProbe(ddp, on_cpu=False)
    assert probe.read([]) == {}


def test_a_refused_sample_rate_still_reads_ddps_own_samples() -> None:
    class Refusing(LoggingData):
        def _set_ddp_runtime_logging_sample_rate(self, rate: int) -> None:
            raise RuntimeError("this torch has no such setting")

    ddp = Refusing()
    probe = DdpProbe(ddp, on_cpu=True)
    assert isinstance(probe.rate_error, RuntimeError) and not probe.averaging
    ddp.step(10, 20, 8, 6)
    assert probe.read([])["comm_s"] == pytest.approx(0.008)


class TestATorchWithoutThePrivateApi:
    """``_get_ddp_logging_data`` is private: where it is gone or changed, the DDP figures are N/A and say why."""

    def test_no_logging_data_method(self) -> None:
        class Gone:
            def _set_ddp_runtime_logging_sample_rate(self, rate: int) -> None:
                pass

        probe = DdpProbe(Gone(), on_cpu=True)
        assert isinstance(probe.rate_error, AttributeError)  # __init__ asked it for the first iteration
        assert probe.read([]) == {}
        assert probe.not_measured == NO_LOGGING_DATA

    @pytest.mark.parametrize("data", [None, ["iteration", 3], {"iter": 3}, {"iteration": "3"}])
    def test_logging_data_of_another_shape(self, data: object) -> None:
        class Changed(LoggingData):
            def _get_ddp_logging_data(self) -> Any:
                return data

        probe = DdpProbe(Changed(), on_cpu=True)
        assert probe.read([]) == {}
        assert probe.not_measured == UNREADABLE

    def test_the_table_says_why(self) -> None:
        """The reporter sends a probe's ``not_measured`` as an event; the rank's N/A DDP cells quote it."""
        store = Store()
        store.ingest(Hello(run_id="job", rank=0, pid=1, device="cpu", ddp=True), now=0.0)
        store.ingest(Event(run_id="job", rank=0, t=0.5, kind="not_measured", message=f"ddp_stats: {NO_LOGGING_DATA}"),
                     now=0.5)  # fmt: skip
        (view,) = store.snapshot(1.0).runs[0].ranks
        assert na_reasons(view, rank_stats(()))["ddp"] == f"DDP stats unavailable: {NO_LOGGING_DATA}"

    def test_no_sample_rate_setting_still_reads_ddps_own_samples(self) -> None:
        class Older(LoggingData):
            _set_ddp_runtime_logging_sample_rate = None  # type: ignore[assignment]

        ddp = Older()
        probe = DdpProbe(ddp, on_cpu=True)
        assert probe.rate_error is not None and not probe.averaging
        ddp.step(10, 20, 8, 6)
        assert probe.read([])["comm_s"] == pytest.approx(0.008) and probe.not_measured is None


def test_ddp_settings_count_the_rebuilt_buckets_that_run() -> None:
    """DDP rebuilds its buckets after the first iteration: the construction-time layout is often one bucket."""
    data = {"bucket_sizes": "38440", "has_rebuilt_buckets": 1, "rebuilt_bucket_sizes": "1024, 2048, 4096"}
    assert ddp_settings(data)["ddp_buckets"] == 3
    assert ddp_settings({"bucket_sizes": "38440", "has_rebuilt_buckets": 0})["ddp_buckets"] == 1
    assert "ddp_buckets" not in ddp_settings({"find_unused_parameters": 1})
