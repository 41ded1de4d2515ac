"""Job ids: a rank under Slurm, Kubernetes or torchrun is named the way its scheduler names it."""

from __future__ import annotations

from gputop.model.jobs import job_text
from gputop.reporter.facts import identity, job_facts, run_id
from tests.support.tui_fixtures import hello

SLURM = {"SLURM_JOB_ID": "48213", "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "gpu[01-04]"}


def test_each_launchers_rank_and_local_rank_are_read() -> None:
    """The local rank picks the GPU a rank is joined to and the node's sampler: the global rank would not do."""

    def where(env: dict[str, str]) -> tuple[int, int, int]:
        found = identity(env)
        return found["rank"], found["local_rank"], found["world_size"]

    torchrun = {"RANK": "9", "LOCAL_RANK": "1", "WORLD_SIZE": "16"}
    srun = {**SLURM, "SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_NTASKS": "16"}
    assert where(torchrun) == (9, 1, 16)
    assert where(srun) == (9, 1, 16)  # a task per GPU, no torchrun: rank 9 is the second GPU of node 2
    assert where({"OMPI_COMM_WORLD_RANK": "9", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "16"}) == (
        9,
        1,
        16,
    )
    assert where({**srun, **torchrun, "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}) == (9, 1, 16)  # torchrun in sbatch
    # Another launcher's local rank is taken only where its rank is ours.
    assert where({**SLURM, "RANK": "3", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "WORLD_SIZE": "4"}) == (3, 3, 4)
    assert where({}) == (0, 0, 1)


def test_slurm_job_and_step_name_the_run_for_every_task() -> None:
    a = run_id({**SLURM, "MASTER_PORT": "29500", "LOCAL_RANK": "0"}, 8)
    b = run_id({**SLURM, "MASTER_PORT": "29500", "LOCAL_RANK": "3"}, 8)
    assert a == b and a.endswith("-slurm48213.0")
    assert run_id({**SLURM, "SLURM_STEP_ID": "1"}, 8).endswith("-slurm48213.1")  # the next srun step is another run
    assert run_id({**SLURM, "GPUTOP_RUN_ID": "mine"}, 8) == "mine"


def test_job_facts_read_slurm_kubernetes_and_torchrun(tmp_path) -> None:
    namespace = tmp_path / "namespace"
    namespace.write_text("research\n")
    env = {**SLURM, "TORCHELASTIC_RUN_ID": "8c1f", "KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "trainer-0"}
    assert job_facts(env, namespace_file=str(namespace)) == {
        "slurm_job_id": "48213",
        "slurm_step_id": "0",
        "slurm_nodelist": "gpu[01-04]",
        "elastic_run_id": "8c1f",
        "k8s_pod": "trainer-0",
        "k8s_namespace": "research",
    }
    downward = {"KUBERNETES_SERVICE_HOST": "x", "POD_NAME": "w-1", "POD_NAMESPACE": "ml", "HOSTNAME": "h"}
    assert job_facts(downward) == {"k8s_pod": "w-1", "k8s_namespace": "ml"}
    # Outside a scheduler, and torchrun without a rendezvous id: nothing to show.
    assert job_facts({"TORCHELASTIC_RUN_ID": "none", "HOSTNAME": "laptop"}) == {}


def test_the_header_shortens_torchruns_long_id_and_the_report_keeps_it() -> None:
    h = hello("r", 0, 2, elastic_run_id="b55d63fc-ebd0-4706-83bf-81f4b1ac7615")
    assert job_text(h, short=True) == "torchrun b55d63fc…"
    assert job_text(h) == "torchrun b55d63fc-ebd0-4706-83bf-81f4b1ac7615"
