"""The scheduler's names for a run (Slurm, Kubernetes, torchrun), as the header and the report show them.

Pure: read from a rank's hello.  A user who knows their job as "Slurm 48213"
or "pod trainer-0" finds it under that name, not only under gputop's run id.
"""

from __future__ import annotations

from gputop.protocol import Hello

JOB_FIELDS = ("slurm_job_id", "slurm_step_id", "slurm_nodelist", "k8s_pod", "k8s_namespace", "elastic_run_id")


def job_ids(hello: Hello) -> dict[str, str]:
    """The job-id fields a rank reported (absent ones left out)."""
    return {name: getattr(hello, name) for name in JOB_FIELDS if getattr(hello, name) is not None}


SHORT_ID_CHARS = 8  # torchrun's --standalone ids are 36-character UUIDs; 8 tell runs apart on one screen


def job_text(hello: Hello, *, short: bool = False) -> str:
    """One line: "slurm 48213.0 on gpu[01-04] · pod ns/trainer-0 · torchrun 8c1f…"; "" outside a scheduler.

    ``short`` (the header) cuts a long torchrun id to its first characters; the report keeps it whole.
    """
    parts = []
    if hello.slurm_job_id:
        step = f".{hello.slurm_step_id}" if hello.slurm_step_id else ""
        nodes = f" on {hello.slurm_nodelist}" if hello.slurm_nodelist else ""
        parts.append(f"slurm {hello.slurm_job_id}{step}{nodes}")
    if hello.k8s_pod:
        namespace = f"{hello.k8s_namespace}/" if hello.k8s_namespace else ""
        parts.append(f"pod {namespace}{hello.k8s_pod}")
    if hello.elastic_run_id:
        elastic = hello.elastic_run_id
        if short and len(elastic) > SHORT_ID_CHARS + 1:
            elastic = elastic[:SHORT_ID_CHARS] + "…"
        parts.append(f"torchrun {elastic}")
    return " · ".join(parts)
