"""nn.DataParallel: one rank on several GPUs, shown under each of them, and DDP suggested when GPU 0 gathers."""

from __future__ import annotations

import pytest

from gputop.collect.store import Store
from gputop.diagnose import Finding, diagnose
from gputop.diagnose.details import DataParallelDetails
from gputop.model.figures import summarize
from gputop.model.samples import GpuProcess, GpuSample
from gputop.model.snapshot import Snapshot
from gputop.tui.view import build_view
from tests.support import tui_fixtures as fx

UUIDS = tuple(f"GPU-{g:08d}-aaaa-bbbb-cccc-000000000000" for g in range(4))


def data_parallel_run(*, first_util: float, first_mem_gib: float, other_util: float = 60.0) -> Snapshot:
    """One DataParallel rank on GPUs 0-3 of this machine; GPU 0's load is the knob."""
    store = Store(listen=fx.LISTEN)
    hello = fx.hello("dp", 0, 1, ddp=False, data_parallel=True, device_uuid=UUIDS[0], device_uuids=UUIDS, backend=None)
    store.ingest(hello, fx.T0)
    for seq in range(20):
        store.ingest(fx.window("dp", 0, seq, step_s=0.1, loader_s=0.001, ddp=False), fx.T0 + (seq + 1) * fx.WINDOW_S)
    for i in range(10):
        gpus = tuple(
            fx.gpu_reading(g, util=first_util if g == 0 else other_util, mem_gib=first_mem_gib if g == 0 else 20.0,
                           processes=(GpuProcess(pid=hello.pid, used_bytes=int(20 * fx.GIB), name="python"),))
            for g in range(4)
        )  # fmt: skip
        store.add_gpu(GpuSample(t=fx.T0 + i, gpus=gpus, driver_version="550.54.15"))
    return store.snapshot(fx.T0 + 20 * fx.WINDOW_S)


def dp_findings(snapshot: Snapshot) -> list[Finding]:
    return [f for f in diagnose(summarize(snapshot)) if isinstance(f.details, DataParallelDetails)]


def test_the_gpu_panel_shows_the_rank_under_each_of_its_gpus() -> None:
    view = build_view(summarize(data_parallel_run(first_util=60, first_mem_gib=20)))
    assert [row.ranks for row in view.gpu_rows] == [("r0 DP",)] * 4
    (row,) = view.rank_rows
    assert row.gpu == "0+3"
    # Its figures are its first GPU's, where outputs gather; no GPU counts as idle or unassigned.
    gpu = view.figures.runs[0].ranks[0].gpu
    assert gpu is not None and gpu.index == 0
    assert not [f for f in diagnose(view.figures) if f.cause == "allocation"]


@pytest.mark.parametrize(
    ("first_util", "first_mem_gib", "fires"),
    [
        (95.0, 20.0, True),  # GPU 0 35 points busier than its three peers
        (60.0, 34.0, True),  # GPU 0 holds 1.7x the memory: the gathered outputs
        (66.0, 22.0, False),  # a few points and 10% apart: replicas, not a bottleneck
    ],
)
def test_a_skewed_first_gpu_suggests_ddp(first_util: float, first_mem_gib: float, fires: bool) -> None:
    findings = dp_findings(data_parallel_run(first_util=first_util, first_mem_gib=first_mem_gib))
    if not fires:
        assert findings == []
        return
    (finding,) = findings
    assert finding.severity == "warn" and finding.gpus == (0, 1, 2, 3) and finding.ranks == (0,)
    assert "DistributedDataParallel" in finding.suggestion and "--nproc_per_node=4" in finding.suggestion
    assert "GPU 0 gathers" in finding.title
    # A model_config finding with a section of its own in docs/diagnosis.md.
    assert finding.doc == "docs/diagnosis.md#data_parallel"
