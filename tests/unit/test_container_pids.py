"""A containerised job: NVML lists each rank's process under the host's PID, which the container cannot see.

Every Kubernetes pod looks like this (NVML reports host PIDs; an NVIDIA maintainer
in nvidia-docker #1483).  The GPU readings come through the real nvidia-ml-py over
the stand-in libnvidia-ml; the ranks are the diagnosis fixtures' steady-state ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gputop.collect.gpu.nvml import Nvml
from gputop.collect.gpu.sampler import GpuSampler
from gputop.model.figures import summarize
from gputop.model.join import join_ranks_to_gpus
from gputop.model.samples import GpuReading
from tests.support.diagnose_fixtures import RankSpec, cuda_hello, findings_of, make_snapshot
from tests.support.nvml_standin import Gpu, MiB, Process, Scenario, use_in_process

UUID = cuda_hello(0)["device_uuid"]
HOST_PID = 4123457  # a host PID: far above any PID in this test's namespace


def readings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *processes: Process) -> tuple[GpuReading, ...]:
    scenario = Scenario(
        [Gpu(uuid=UUID, used_bytes=sum(p.used_bytes or 0 for p in processes), processes=list(processes))]
    )
    use_in_process(monkeypatch, scenario.write(tmp_path / "scenario"))
    sample = GpuSampler(Nvml()).sample()  # the real /proc check says which PIDs are here
    assert sample.unavailable is None, sample.unavailable
    return sample.gpus


def one_rank(gpus: tuple[GpuReading, ...], mem_peak_frac: float | None = 600 / 81920):
    spec = RankSpec(rank=0, mem_peak_frac=mem_peak_frac, hello=cuda_hello(0))
    return make_snapshot([spec], gpus=gpus)


def test_the_ranks_own_process_under_a_host_pid_is_not_a_second_tenant(tmp_path, monkeypatch) -> None:
    gpus = readings(tmp_path, monkeypatch, Process(pid=HOST_PID, used_bytes=600 * MiB))
    snapshot = one_rank(gpus)
    (assignment,) = join_ranks_to_gpus(snapshot)
    assert assignment.unobserved == ()
    assert [p.pid for p in assignment.from_other_namespace] == [HOST_PID]
    titles = [f.title for f in findings_of(snapshot)]
    assert not [t for t in titles if "shared" in t or "not reporting" in t], titles


def test_a_real_second_tenant_is_still_named(tmp_path, monkeypatch) -> None:
    """Two hidden processes, one rank: the one that fits the rank is its own, the other is someone else's."""
    gpus = readings(
        tmp_path,
        monkeypatch,
        Process(pid=HOST_PID, used_bytes=600 * MiB),
        Process(pid=HOST_PID + 1, used_bytes=30_000 * MiB),
    )
    snapshot = one_rank(gpus)
    (assignment,) = join_ranks_to_gpus(snapshot)
    assert [p.pid for p in assignment.from_other_namespace] == [HOST_PID]
    assert [p.pid for p in assignment.unobserved] == [HOST_PID + 1]
    titles = [f.title for f in findings_of(snapshot)]
    assert any(f"pid {HOST_PID + 1}" in t and "shared" in t for t in titles), titles


def test_a_hidden_process_holding_far_more_than_the_rank_is_not_taken_as_the_ranks(tmp_path, monkeypatch) -> None:
    gpus = readings(tmp_path, monkeypatch, Process(pid=HOST_PID, used_bytes=40_000 * MiB))
    snapshot = one_rank(gpus)
    (assignment,) = join_ranks_to_gpus(snapshot)
    assert assignment.from_other_namespace == ()
    assert [p.pid for p in assignment.unobserved] == [HOST_PID]


def test_the_report_says_where_the_pids_come_from(tmp_path, monkeypatch) -> None:
    from gputop.model.gpu_summary import summarize_gpus

    gpus = readings(tmp_path, monkeypatch, Process(pid=HOST_PID, used_bytes=600 * MiB))
    snapshot = one_rank(gpus)
    summary = summarize_gpus(list(snapshot.gpu_samples()), snapshot)
    (gpu,) = summary["gpus"]
    assert gpu["unobserved"] == []
    assert gpu["pids_from_other_namespace"] == [HOST_PID]
    assert summarize(snapshot).assignments[0].from_other_namespace
