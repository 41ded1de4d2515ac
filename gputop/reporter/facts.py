"""Who this rank is and the static facts worth diagnosing: the hello message's content.

Read once at ``watch()`` (and again when a loader is tracked or autocast is
first seen).  Every probe is defensive: a missing attribute or a changed
private API leaves the fact as None (N/A) and never raises.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from gputop import settings
from gputop.protocol import Hello
from gputop.reporter.device_peak import tf32_modes


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


# Where each launcher puts a process's rank, its rank on its node and the world size:
# torchrun / torch.distributed first, then srun (a task per GPU, with
# init_process_group reading SLURM_*), then Open MPI, then MPICH/Intel MPI.
LAUNCHER_VARS = (
    ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),
)


def identity(env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """rank, local_rank, world_size, backend and run_id, from torch.distributed or the launcher's env.

    A rank's local rank decides which GPU it is joined to when NVML sees no pid
    of it, and which rank of a node starts the node's GPU sampler: under srun
    without torchrun there is no LOCAL_RANK, and taking the global rank would
    make rank 8 on the second node "local rank 8".  A launcher's local rank is
    believed only where its rank is this process's: mp.spawn's children under
    one srun task all see SLURM_LOCALID=0.
    """
    found = [(_env_int(env, r), _env_int(env, lr), _env_int(env, w)) for r, lr, w in LAUNCHER_VARS]
    rank = next((r for r, _, _ in found if r is not None), None)
    world = next((w for r, _, w in found if r is not None and w is not None), None)
    backend = None
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
            backend = str(dist.get_backend())
    except Exception:
        pass
    rank = rank if rank is not None else 0
    world = world if world is not None else 1
    torchrun_local = found[0][1]
    local = (
        torchrun_local
        if torchrun_local is not None
        else next((lr for r, lr, _ in found[1:] if r == rank and lr is not None), rank)
    )
    return {
        "rank": rank,
        "world_size": world,
        "local_rank": local,
        "backend": backend,
        "run_id": run_id(env, world),
        **job_facts(env),
    }


K8S_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def job_facts(env: Mapping[str, str] = os.environ, namespace_file: str = K8S_NAMESPACE_FILE) -> dict[str, str]:
    """The scheduler's names for this job: Slurm job, step and nodes; Kubernetes pod and namespace; torchrun's id.

    Kubernetes sets no variable naming the pod unless the manifest passes it
    (``POD_NAME``/``POD_NAMESPACE`` through the downward API, the common
    convention); without it a pod's hostname is its name, and the namespace is
    in the service account's mounted file.
    """
    found: dict[str, str] = {}
    for key, name in (
        ("slurm_job_id", "SLURM_JOB_ID"),
        ("slurm_step_id", "SLURM_STEP_ID"),
        ("slurm_nodelist", "SLURM_JOB_NODELIST"),
        ("elastic_run_id", "TORCHELASTIC_RUN_ID"),
    ):
        value = env.get(name, "")
        if value and value != "none":  # torchrun without a rendezvous id says "none"
            found[key] = value[:256]
    if env.get("KUBERNETES_SERVICE_HOST"):
        pod = env.get("POD_NAME") or env.get("HOSTNAME") or socket.gethostname()
        found["k8s_pod"] = pod[:256]
        namespace = env.get("POD_NAMESPACE", "")
        if not namespace:
            with contextlib.suppress(OSError), open(namespace_file, encoding="utf-8") as handle:
                namespace = handle.read(256).strip()
        if namespace:
            found["k8s_namespace"] = namespace
    return found


def run_id(env: Mapping[str, str] = os.environ, world_size: int = 1) -> str:
    """A name every rank of one job agrees on without talking to the others.

    GPUTOP_RUN_ID wins; then the Slurm job and step (every task of an srun
    step has them); then torchrun's rendezvous id; under torchrun without
    one, its agent's pid (the parent of every local rank) and the master port;
    then the master port alone (mp.spawn, Lightning, srun: every rank is told
    it); a single process is its own run.  A later job reusing a name replaces
    the earlier one's ranks in the dashboard (the store sees a new pid).
    """
    chosen = settings.RUN_ID.value(env)
    if chosen:
        return chosen
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    slurm_job = env.get("SLURM_JOB_ID")
    if slurm_job:
        step = env.get("SLURM_STEP_ID")
        return f"{script}-slurm{slurm_job}" + (f".{step}" if step else "")
    elastic = env.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic != "none":
        return f"{script}-{elastic}"
    port = env.get("MASTER_PORT", "")
    if elastic == "none" and port and world_size > (_env_int(env, "LOCAL_WORLD_SIZE") or world_size):
        # Several nodes under a static rendezvous: the agents' pids differ per node, the master does not.
        return f"{script}-{env.get('MASTER_ADDR', 'localhost')}:{port}"
    if elastic == "none":
        return f"{script}-{os.getppid()}" + (f"-{port}" if port else "")
    if port and world_size > 1:
        return f"{script}-{env.get('MASTER_ADDR', 'localhost')}:{port}"
    return f"{script}-{os.getpid()}"


def cpu_count() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def model_facts(model: Any) -> dict[str, Any]:
    """Device, parameter dtype and whether it is DDP, from a module (or None)."""
    if model is None:
        return {}
    facts: dict[str, Any] = {"model_name": type(model).__name__}
    inner = getattr(model, "module", model)
    facts["ddp"] = type(model).__name__ == "DistributedDataParallel"
    facts["data_parallel"] = type(model).__name__ == "DataParallel"
    if facts["ddp"] or facts["data_parallel"]:
        facts["model_name"] = type(inner).__name__
    try:
        dtypes: Counter[str] = Counter()
        device = None
        for p in model.parameters():
            dtypes[str(p.dtype).replace("torch.", "")] += p.numel()
            device = device or p.device
        if dtypes:
            facts["param_dtype"] = dtypes.most_common(1)[0][0]
        if device is not None:
            facts["device"] = str(device)
    except Exception:
        pass
    compute = fsdp2_compute_dtype(model)
    if compute is not None:  # FSDP2 keeps fp32 shards and computes in the policy's dtype: that is the precision
        facts["param_dtype"] = compute
    return facts


def fsdp2_compute_dtype(model: Any) -> str | None:
    """The dtype an FSDP2 root computes in, from its ``MixedPrecisionPolicy(param_dtype=...)``; None without one."""
    get_state = getattr(model, "_get_fsdp_state", None)  # fully_shard's FSDPModule
    if get_state is None:
        return None
    try:
        dtype = get_state()._mp_policy.param_dtype
    except Exception:
        return None
    return None if dtype is None else str(dtype).replace("torch.", "")


def data_parallel_facts(model: Any) -> dict[str, Any]:
    """Every GPU an ``nn.DataParallel`` replicates onto, by UUID (its first device, where outputs gather, first)."""
    ids = [int(i) for i in getattr(model, "device_ids", None) or []]
    if not ids:  # DataParallel without CUDA runs the module as is
        return {}
    facts = device_facts(f"cuda:{ids[0]}")
    uuids = [device_facts(f"cuda:{i}").get("device_uuid") for i in ids]
    if all(uuids):
        facts["device_uuids"] = tuple(uuids)
    return facts


def device_facts(device: str | None) -> dict[str, Any]:
    """Name, UUID and memory of a CUDA device named with its index ("cuda:3"); nothing for CPU.

    A bare "cuda" is not resolved with ``torch.cuda.current_device()``: that
    is device 0 on any thread that never chose one, whatever GPU the model is on.
    """
    if not device or not device.startswith("cuda"):
        return {}
    try:
        import torch

        index = torch.device(device).index
        if index is None:
            return {}
        props = torch.cuda.get_device_properties(index)
        uuid = getattr(props, "uuid", None)
        uuid_text = None if uuid is None else str(uuid)
        if uuid_text and not uuid_text.upper().startswith(("GPU-", "MIG-")):
            uuid_text = "GPU-" + uuid_text
        return {
            "device": f"cuda:{index}",
            "device_name": props.name,
            "device_uuid": uuid_text,
            "device_total_bytes": int(props.total_memory),
        }
    except Exception:
        return {}


def torch_facts() -> dict[str, Any]:
    """Version and the global switches that matter for speed."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    facts: dict[str, Any] = {}
    for key, read in (
        ("torch_version", lambda: str(torch.__version__)),
        ("torch_threads", lambda: int(torch.get_num_threads())),
        ("cudnn_benchmark", lambda: bool(torch.backends.cudnn.benchmark)),
    ):
        with contextlib.suppress(Exception):
            facts[key] = read()
    facts.update(tf32_facts())
    return facts


def tf32_facts() -> dict[str, bool]:
    """Whether TF32 may run float32 matmuls and convolutions now, as hello facts (those torch can say), through torch
    2.9+'s fp32_precision where a script set it: its old flags raise then.  Read at start and every window after
    (a script that allows TF32 after ``watch()``)."""
    modes = zip(("tf32_matmul", "tf32_cudnn"), tf32_modes(), strict=True)
    return {key: allowed for key, allowed in modes if allowed is not None}


def loader_facts(loader: Any) -> dict[str, Any]:
    """The DataLoader settings that decide input throughput (absent ones stay N/A)."""
    facts: dict[str, Any] = {}
    for attr, key, kind in (
        ("batch_size", "loader_batch_size", int),
        ("num_workers", "loader_num_workers", int),
        ("pin_memory", "loader_pin_memory", bool),
        ("persistent_workers", "loader_persistent_workers", bool),
        ("prefetch_factor", "loader_prefetch_factor", int),
    ):
        value = getattr(loader, attr, None)
        if isinstance(value, (int, bool)):
            facts[key] = kind(value)
    if "loader_batch_size" not in facts:
        # A loader built from a batch sampler (Accelerate's prepared DataLoaderShard, a bucketing sampler) has
        # batch_size None; its sampler knows the rank's batch, unless it splits a global one across processes.
        sampler = getattr(loader, "batch_sampler", None)
        size = getattr(sampler, "batch_size", None)
        if isinstance(size, int) and size > 0 and not getattr(sampler, "split_batches", False):
            facts["loader_batch_size"] = size
    return facts


@functools.cache
def _hello_fields() -> frozenset[str]:
    """Hello's field names, once: ``msgspec.structs.fields`` resolves every annotation (~0.8 ms a call)."""
    return frozenset(Hello.__struct_fields__)


def build_hello(base: dict[str, Any], window_s: float, started_t: float, version: str) -> Hello:
    """A Hello from the collected facts (unknown keys are ignored)."""
    known = _hello_fields()
    fields = {k: v for k, v in base.items() if k in known}
    return Hello(
        hostname=socket.gethostname(),
        pid=os.getpid(),
        parent_pid=os.getppid() or None,
        name=os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python",
        started_t=started_t or time.time(),
        window_s=window_s,
        gputop_version=version,
        cpu_count=cpu_count(),
        **fields,
    )
