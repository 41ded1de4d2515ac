"""The rank-GPU join on synthetic snapshots: what the GPU panel, report and diagnosis rely on."""

from __future__ import annotations

from gputop.collect.store import Store
from gputop.model.join import join_ranks_to_gpus, normalize_uuid
from gputop.model.samples import (
    GpuProcess,
    GpuReading,
    GpuSample,
    HostSample,
    ProcessReading,
    host_sample_from_dict,
    sample_to_dict,
)
from gputop.model.snapshot import Snapshot
from gputop.protocol import Hello


def gpu_of_rank(snap: Snapshot) -> dict[tuple[str, int], int]:
    """(run_id, rank) -> the NVML index of the GPU the join puts it on."""
    return {(r.run_id, r.rank): a.gpu.index for a in join_ranks_to_gpus(snap) for r in a.ranks}


UUIDS = [f"{i:08x}-aaaa-bbbb-cccc-dddddddddddd" for i in range(8)]


def node(gpus: list[GpuReading], hellos: list[Hello], host: HostSample | None = None) -> Snapshot:
    store = Store()
    for hello in hellos:
        store.ingest(hello, now=0.0)
    store.add_gpu(GpuSample(t=0.0, gpus=tuple(gpus)))
    if host is not None:
        store.add_host(host)
    return store.snapshot(0.0)


def gpu(index: int, uuid: str, *pids: int, used_gb: int = 4) -> GpuReading:
    return GpuReading(
        index=index, uuid=uuid, processes=tuple(GpuProcess(pid=p, used_bytes=used_gb << 30) for p in pids)
    )


class TestUuidJoin:
    def test_torch_and_nvml_spellings_match(self) -> None:
        assert normalize_uuid("GPU-ABCDEF01-2345-6789-abcd-ef0123456789") == normalize_uuid(
            "abcdef01-2345-6789-ABCD-EF0123456789"
        )
        assert normalize_uuid("MIG-1234-5678") == normalize_uuid("mig-12345678")
        assert normalize_uuid("GPU-1") != normalize_uuid("GPU-2")
        assert normalize_uuid(None) == normalize_uuid("") == ""

    def test_ranks_join_by_uuid_not_by_cuda_index(self) -> None:
        """CUDA_VISIBLE_DEVICES=7,6,...,0: every rank says cuda:0-ish indices that are not NVML's."""
        gpus = [gpu(i, f"GPU-{UUIDS[i]}", 100 + (7 - i)) for i in range(8)]
        hellos = [
            Hello(run_id="job", rank=r, local_rank=r, pid=100 + r, device="cuda:0", device_uuid=UUIDS[7 - r].upper())
            for r in range(8)
        ]
        snap = node(gpus, hellos)
        assignments = join_ranks_to_gpus(snap)
        assert [[rv.rank for rv in a.ranks] for a in assignments] == [[7], [6], [5], [4], [3], [2], [1], [0]]
        assert all(a.unobserved == () for a in assignments)
        assert gpu_of_rank(snap) == {("job", r): 7 - r for r in range(8)}

    def test_two_jobs_on_one_gpu_and_an_idle_gpu(self) -> None:
        gpus = [gpu(0, "GPU-" + UUIDS[0], 10, 20), gpu(1, "GPU-" + UUIDS[1])]
        hellos = [
            Hello(run_id="a", rank=0, pid=10, device_uuid="GPU-" + UUIDS[0]),
            Hello(run_id="b", rank=0, pid=20, device_uuid="GPU-" + UUIDS[0]),
        ]
        first, second = join_ranks_to_gpus(node(gpus, hellos))
        assert sorted(rv.run_id for rv in first.ranks) == ["a", "b"]
        assert second.ranks == () and second.unobserved == ()

    def test_uuid_from_another_machine_does_not_fall_back_to_pid(self) -> None:
        """A remote rank's pid can collide with a local process; its UUID is the truth."""
        gpus = [gpu(0, "GPU-" + UUIDS[0], 10)]
        snap = node(gpus, [Hello(run_id="a", rank=1, pid=10, device_uuid="GPU-" + UUIDS[5], hostname="node2")])
        (only,) = join_ranks_to_gpus(snap)
        assert only.ranks == ()
        assert gpu_of_rank(snap) == {}


class TestPidFallback:
    def test_rank_without_uuid_joins_where_its_memory_is(self) -> None:
        """A stray context on GPU 0 (every rank touching cuda:0) does not steal the rank."""
        gpus = [gpu(0, "GPU-" + UUIDS[0], 30, used_gb=1), gpu(1, "GPU-" + UUIDS[1]), gpu(2, "GPU-" + UUIDS[2], 30)]
        snap = node(gpus, [Hello(run_id="a", rank=2, pid=30)])
        assert gpu_of_rank(snap) == {("a", 2): 2}
        assert join_ranks_to_gpus(snap)[0].unobserved == ()  # the stray context is still the rank's

    def test_rank_without_uuid_or_gpu_process_is_nowhere(self) -> None:
        snap = node([gpu(0, "GPU-" + UUIDS[0], 99)], [Hello(run_id="a", rank=0, pid=30)])
        assert gpu_of_rank(snap) == {}
        assert [p.pid for p in join_ranks_to_gpus(snap)[0].unobserved] == [99]


class TestUnobserved:
    def test_foreign_process_is_unobserved_but_a_ranks_worker_is_not(self) -> None:
        gpus = [gpu(0, "GPU-" + UUIDS[0], 10, 11, 4242)]
        host = HostSample(t=0.0, processes=(ProcessReading(pid=10, children=1, child_pids=(11,)),))
        snap = node(gpus, [Hello(run_id="a", rank=0, pid=10, device_uuid=UUIDS[0])], host)
        (only,) = join_ranks_to_gpus(snap)
        assert [rv.rank for rv in only.ranks] == [0]
        assert [p.pid for p in only.unobserved] == [4242]

    def test_child_pids_survive_a_recording(self) -> None:
        host = HostSample(t=1.0, processes=(ProcessReading(pid=10, children=2, child_pids=(11, 12)),))
        assert host_sample_from_dict(sample_to_dict(host)) == host


class TestMig:
    def test_rank_on_a_mig_instance_reports_the_parent_index(self) -> None:
        gpus = [
            GpuReading(index=3, uuid="GPU-parent"),
            GpuReading(index=3, uuid="MIG-aaaa", mig_parent_uuid="GPU-parent", processes=(GpuProcess(pid=10),)),
            GpuReading(index=3, uuid="MIG-bbbb", mig_parent_uuid="GPU-parent"),
        ]
        snap = node(gpus, [Hello(run_id="a", rank=0, pid=10, device_uuid="MIG-AAAA")])
        parent, mine, other = join_ranks_to_gpus(snap)
        assert parent.ranks == () and other.ranks == ()
        assert [rv.rank for rv in mine.ranks] == [0]
        assert gpu_of_rank(snap) == {("a", 0): 3}


def test_no_gpu_data_joins_nothing() -> None:
    store = Store()
    store.ingest(Hello(run_id="a", rank=0, pid=10, device_uuid=UUIDS[0]), now=0.0)
    assert join_ranks_to_gpus(store.snapshot(0.0)) == []
    store.add_gpu(GpuSample(t=0.0, unavailable="no driver"))
    assert join_ranks_to_gpus(store.snapshot(0.0)) == []
    assert gpu_of_rank(store.snapshot(0.0)) == {}
