"""DDP's timings of zero are "not measured", never "0 ms"; a real iteration, however short, is a measurement.

At each sampled iteration DDP's logger sets its four times to 0, then fills
each one it can time: it leaves them all at 0 for a CUDA module on several
devices (c10d ``Logger::set_runtime_stats_and_log``) and a time at 0 when
its timer had no usable pair of events.  Neither happens on a CPU gloo
group, so a real in-process DDP model shows the measured side, and logging
data as DDP leaves it shows the zero side.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from gputop.reporter.probes.ddp import ALL_ZERO, DDP_TIMES, MULTI_DEVICE, DdpProbe
from gputop.reporter.reporter import Reporter
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import free_port

NS = 1e9


@pytest.fixture(autouse=True)
def no_rate_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUTOP_DDP_SAMPLE_RATE", raising=False)


@pytest.fixture
def ddp_model() -> Iterator[nn.parallel.DistributedDataParallel]:
    """A real DDP model in a one-process gloo group, its hold on the group let go before the group is destroyed.

    DDP's reducer (and its logger, which holds the reducer) keep a reference to the
    process group.  Left to pytest, the model is freed only after the fixture's
    teardown, when it drops the test's arguments: the gloo group's destructor then
    ran after ``destroy_process_group`` and joined worker threads that never woke,
    and the suite hung for good in CI (py-spy: ``~Reducer`` -> ``~ProcessGroupGloo``
    -> ``std::thread::join``, under ``runtestprotocol``).  So the reducer goes first.
    """
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}")
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)))
    try:
        yield model
    finally:
        for name in ("logger", "reducer"):  # the logger holds the reducer, the reducer the group
            if hasattr(model, name):
                delattr(model, name)
        gc.collect()
        dist.destroy_process_group()


def iterate(model: nn.Module, times: int) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(times):
        model(torch.randn(4, 32)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()


class Logged:
    """What ``_get_ddp_logging_data()`` returns, set by the test: DDP's latest times and running averages (ns)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def _set_ddp_runtime_logging_sample_rate(self, rate: int) -> None:
        pass

    def _get_ddp_logging_data(self) -> dict[str, Any]:
        return dict(self.data)


def times_ns(forward: float, backward: float, comm: float, overlap: float, *, prefix: str = "") -> dict[str, float]:
    return {prefix + key: value for (key, _), value in zip(DDP_TIMES, (forward, backward, comm, overlap), strict=True)}


@pytest.mark.parametrize("sample_rate", ["1", "10"], ids=["every-iteration-averaged", "latest-sample"])
def test_a_real_ddp_iteration_is_a_measurement(ddp_model, monkeypatch: pytest.MonkeyPatch, sample_rate: str) -> None:
    monkeypatch.setenv("GPUTOP_DDP_SAMPLE_RATE", sample_rate)
    probe = DdpProbe(ddp_model, on_cpu=True)
    assert probe.averaging == (sample_rate == "1")
    iterate(ddp_model, 4)  # DDP logs an iteration at the next forward: three are logged
    figures = probe.read([])
    assert figures["ddp_iteration"] == 3 and probe.not_measured is None
    assert all(figures[name] > 0 for name in ("forward_s", "backward_s", "comm_s"))
    assert 0 <= figures["overlap_s"] <= figures["comm_s"]


def test_times_ddp_left_at_zero_are_not_measured(ddp_model) -> None:
    """The real logging data of a real model, with the four times as DDP leaves them when it cannot time."""
    iterate(ddp_model, 3)
    real = ddp_model._get_ddp_logging_data()
    probe = DdpProbe(Logged({**real, **times_ns(0, 0, 0, 0)}), on_cpu=False)
    assert probe.read([]) == {} and probe.not_measured == ALL_ZERO
    probe.model = Logged({**real, **times_ns(0, 0, 0, 0), "is_multi_device_module": 1})
    assert probe.read([]) == {} and probe.not_measured == MULTI_DEVICE


def test_a_module_on_several_devices_is_not_measured_whatever_it_logged() -> None:
    probe = DdpProbe(Logged({"iteration": 20, "is_multi_device_module": 1, **times_ns(5e6, 9e6, 2e6, 1e6)}),
                     on_cpu=False)  # fmt: skip
    assert probe.read([]) == {} and probe.not_measured == MULTI_DEVICE


def test_averages_that_stayed_at_zero_are_not_measured_and_a_later_real_iteration_is() -> None:
    ddp = Logged({"iteration": 0})
    probe = DdpProbe(ddp, on_cpu=True)
    assert probe.averaging
    ddp.data = {"iteration": 3, **times_ns(0, 0, 0, 0), **times_ns(0, 0, 0, 0, prefix="avg_")}
    assert probe.read([]) == {} and probe.not_measured == ALL_ZERO
    # One timed iteration more: DDP's running average over 4 becomes a quarter of it.
    ddp.data = {"iteration": 4, **times_ns(8e6, 12e6, 4e6, 2e6), **times_ns(2e6, 3e6, 1e6, 0.5e6, prefix="avg_")}
    figures = probe.read([])
    assert probe.not_measured is None and figures["ddp_steps"] == 1
    assert figures["forward_s"] == pytest.approx(0.008) and figures["comm_s"] == pytest.approx(0.004)


def test_a_tiny_but_nonzero_time_is_still_a_measurement() -> None:
    latest = DdpProbe(Logged({"iteration": 30, **times_ns(0, 0, 700, 0)}), on_cpu=False)
    assert latest.read([])["comm_s"] == pytest.approx(700 / NS) and latest.not_measured is None
    ddp = Logged({"iteration": 0})
    averaged = DdpProbe(ddp, on_cpu=True)
    ddp.data = {"iteration": 2, **times_ns(1500, 0, 0, 0), **times_ns(1500, 0, 0, 0, prefix="avg_")}
    figures = averaged.read([])
    assert figures["forward_s"] == pytest.approx(1500 / NS) and figures["overlap_s"] == 0.0
    assert averaged.not_measured is None


def test_the_reason_reaches_the_dashboard_once(collector) -> None:
    reporter = Reporter(collector.address)  # not started: the test closes its windows by hand
    reporter.side.facts.update({"run_id": "zeros", "rank": 0, "world_size": 1, "ddp": True})
    probe = DdpProbe(Logged({"iteration": 12, **times_ns(0, 0, 0, 0)}), on_cpu=False)
    reporter.side.probes = (probe,)
    for _ in range(3):
        reporter.thread._close_window(time.time())

    def delivered() -> bool:
        reporter.thread.sender.pump()
        ranks = snapshot_of(collector).all_ranks()
        return bool(ranks) and len(ranks[0].windows) == 3

    assert wait_for(delivered)
    (rank,) = snapshot_of(collector).all_ranks()
    assert [(e.kind, e.message) for e in rank.events] == [("not_measured", f"ddp_stats: {ALL_ZERO}")]
    assert all(w.comm_s is None for w in rank.windows)  # N/A, not "exposed comm 0 ms"
    reporter.thread.sender.close()


def test_the_dashboard_says_why_ddp_and_gpu_step_figures_are_na() -> None:
    """The reporter's ``not_measured`` events are the N/A reasons one keypress away in the rank detail."""
    from gputop.collect.store import Store
    from gputop.model.sums import rank_stats
    from gputop.protocol import Event, Hello
    from gputop.tui.na import na_reasons

    store = Store()
    store.ingest(Hello(run_id="job", rank=0, pid=1, device="cuda:0", ddp=True), now=0.0)
    for message in ("ddp_stats: " + ALL_ZERO, "gpu_step_times: the model's parameters are on cuda:0 and cuda:1"):
        store.ingest(Event(run_id="job", rank=0, t=0.5, kind="not_measured", message=message), now=0.5)
    (view,) = store.snapshot(1.0).runs[0].ranks
    reasons = na_reasons(view, rank_stats(()))
    assert reasons["ddp"] == f"DDP stats unavailable: {ALL_ZERO}"
    assert reasons["gpu_step"].endswith("on cuda:0 and cuda:1")
