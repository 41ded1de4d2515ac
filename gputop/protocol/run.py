"""What a rank says about its run: hello first, then windows (its steps), events, and bye at the end."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, ClassVar, Literal

import msgspec
from msgspec import Meta

from gputop.protocol.limits import (
    COLLECTIVES_KEPT,
    PROTOCOL_VERSION,
    AtLeastOne,
    Bucket,
    Count,
    LegacyBucket,
    ReadyStepNumbers,
    ReadyTimes,
    Seconds,
    SlowStepNumbers,
    SlowSteps,
    Text,
    TypeName,
    _Message,
)


class Hello(_Message, frozen=True, kw_only=True, tag="hello"):
    """Static facts about one rank, sent first on every connection.

    Sent again on the same connection when a fact becomes known later (for
    example the DataLoader config once ``track()`` is called); the collector
    keeps the latest.
    """

    TYPE: ClassVar[str] = "hello"

    v: Literal[1] = PROTOCOL_VERSION

    run_id: Text
    rank: Count
    world_size: AtLeastOne = 1
    local_rank: Count = 0
    hostname: Text = ""
    pid: Count = 0
    parent_pid: Count | None = None  # what started the rank (torchrun's agent, srun's step): the job's, not a neighbour
    name: Text = ""  # the script, for humans
    started_t: float = 0.0  # unix time the reporter started
    window_s: float = 0.5  # what a hello without it meant: reporters sent 0.5-s windows until 2026-11-28
    gputop_version: Text = ""
    torch_version: Text | None = None
    backend: Text | None = None  # "nccl", "gloo", None when not distributed
    device: Text | None = None  # "cuda:0", "cpu"
    device_name: Text | None = None
    device_uuid: Text | None = None  # "GPU-…" from torch, the key for the NVML join
    device_total_bytes: Count | None = None
    # nn.DataParallel: one rank computing on several GPUs, device_uuid's first.  None for one device.
    device_uuids: tuple[Text, ...] | None = None
    data_parallel: bool | None = None
    loader_batch_size: Count | None = None
    loader_num_workers: Count | None = None
    loader_pin_memory: bool | None = None
    loader_persistent_workers: bool | None = None
    loader_prefetch_factor: Count | None = None
    autocast: bool | None = None  # seen enabled during forward of the watched model
    param_dtype: Text | None = None  # dtype of most parameters, "float32", "bfloat16", …
    tf32_matmul: bool | None = None
    tf32_cudnn: bool | None = None
    # The work a step does (gputop/reporter/flops.py, docs/mfu.md): why its FLOPs are N/A or what a figure leaves
    # out ("" when exact), each dtype's share of the FLOPs counted (the peak MFU is read against), and on a CPU
    # the FLOP/s a fp32 matmul reached on the rank's own threads, measured once, with what measuring it cost.
    flops_note: Text | None = None
    flops_mix: Annotated[dict[Text, Annotated[float, Meta(ge=0.0, le=1.0)]], Meta(max_length=16)] | None = None
    cpu_peak_flops: Annotated[float, Meta(ge=0.0)] | None = None
    cpu_peak_cost_s: Seconds | None = None
    cudnn_benchmark: bool | None = None
    torch_threads: Count | None = None
    cpu_count: Count | None = None  # CPUs this process may run on
    model_name: Text | None = None
    ddp: bool | None = None
    # How DDP was built, from its logging data once it has run an iteration:
    ddp_find_unused_parameters: bool | None = None
    ddp_unused_parameter_bytes: Count | None = None  # what find_unused_parameters found unused
    ddp_static_graph: bool | None = None
    ddp_gradient_as_bucket_view: bool | None = None
    ddp_bucket_cap_bytes: Count | None = None
    ddp_buckets: Count | None = None  # gradient buckets each backward all-reduces
    ddp_gradient_bytes: Count | None = None  # all parameters' size: what one all-reduce round moves
    # The scheduler's names for the job (docs/protocol.md#job-ids): None when not under it.
    slurm_job_id: Text | None = None
    slurm_step_id: Text | None = None
    slurm_nodelist: Text | None = None
    k8s_pod: Text | None = None
    k8s_namespace: Text | None = None
    elastic_run_id: Text | None = None  # torchrun's TORCHELASTIC_RUN_ID (rendezvous id)
    # Optional message types this reporter can send (``OPTIONAL_TYPES``), once the collector accepts them.
    sends: Annotated[tuple[TypeName, ...], Meta(max_length=16)] = ()


class CollectiveTimes(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One kind of collective on one process group, over a window's steps: what the rank's exchange was made of.

    Sent as a short array (``["all_gather", "dp", 12, 786432, 0.0041, 0.0038]``): a window carries a few.
    ``busy_s`` is from issue to completion as the rank saw it (the wait's end for an asynchronous one), summed
    over the calls; ``exposed_s`` the part the training thread spent blocked on it (in the call, or in the
    work's ``wait()``), so ``busy_s - exposed_s`` was hidden behind the rank's other work.
    """

    kind: Annotated[str, Meta(max_length=32)]  # "all_reduce", "all_gather", "reduce_scatter", "broadcast", …
    group: Annotated[str, Meta(max_length=64)]  # the DeviceMesh dimension ("dp", "tp"), else "world" or "pg N"
    calls: Annotated[int, Meta(ge=0, lt=2**53)]
    bytes: Annotated[int, Meta(ge=0, lt=2**53)]  # what the rank sent in (its input tensors' sizes)
    # None where the host's clock cannot time them (collectives on CUDA: docs/communication.md)
    busy_s: Annotated[float, Meta(ge=0.0)] | None
    exposed_s: Annotated[float, Meta(ge=0.0)] | None
    # The group's size, for bus bandwidth (gputop.model.collectives.bandwidth); None from senders before it.
    ranks: Annotated[int, Meta(ge=0, lt=2**31)] | None = None


Collectives = Annotated[tuple[CollectiveTimes, ...], Meta(max_length=COLLECTIVES_KEPT)]


# gc=False: a window holds numbers, strings and flat dicts of numbers, never a cycle, so
# the garbage collector need not walk it.  A dashboard keeps 150,000 of them, and
# walking them stalled every thread for 0.3-0.8 s (a keypress waited that long).
MAX_DIGESTS_SENT = 4096  # a group's collective digests in one window: a second of 4,096 collectives
MAX_DIGEST_SITES = 64  # new (digest, call) pairs in one window: a job's calls repeat, so few are ever new


class GroupDigests(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A process group's collectives issued through the tap since the last window: each one's number and digest.

    On the wire an array, ``["world", [41, 42, 45], "AAEC..."]``: collectives #41, #42 and #45 on world, torch's
    own numbers (alike on every rank; DDP's all-reduce from C++ takes the numbers between), and ``values``, two
    bytes each, big-endian.  A digest covers the call's kind, dtype and size, and at some numbers its call site
    (gputop/reporter/collective_digests.py): ranks whose digests at one number differ issued different calls
    there, a desync, even where the backend went on through it.
    """

    group: Annotated[str, Meta(max_length=64)]
    numbers: Annotated[tuple[Annotated[int, Meta(ge=1)], ...], Meta(max_length=MAX_DIGESTS_SENT)]
    values: Annotated[bytes, Meta(max_length=2 * MAX_DIGESTS_SENT)]

    def digests(self) -> list[tuple[int, int]]:
        """(number, digest) pairs, oldest first."""
        data = self.values
        return [(n, data[2 * i] << 8 | data[2 * i + 1]) for i, n in enumerate(self.numbers) if 2 * i + 1 < len(data)]


def joined_digests(windows: Sequence[Window]) -> dict[str, tuple[GroupDigests, ...] | tuple[DigestSite, ...]]:
    """The digests of consecutive windows as one window would carry them: each group's joined (the newest
    ``MAX_DIGESTS_SENT``), the calls described, the first ``MAX_DIGEST_SITES``."""
    held: dict[str, tuple[list[int], bytearray]] = {}
    for window in windows:
        for sent in window.digests:
            numbers, values = held.setdefault(sent.group, ([], bytearray()))
            numbers.extend(sent.numbers)
            values += sent.values
    joined = tuple(
        GroupDigests(group, tuple(numbers[-MAX_DIGESTS_SENT:]), bytes(values[-2 * MAX_DIGESTS_SENT :]))
        for group, (numbers, values) in held.items()
    )
    sites = tuple(site for window in windows for site in window.digest_sites)[:MAX_DIGEST_SITES]
    return {"digests": joined[:16], "digest_sites": sites}


class DigestSite(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """What one digest stands for, sent once, the first time the rank issues that call: the call, for the
    desync finding's words (``["all_reduce", "float32", 16, "`log_metric` (train.py:71)", 41302]``)."""

    kind: Annotated[str, Meta(max_length=32)]
    dtype: Annotated[str, Meta(max_length=32)]  # "" where the call sends no one tensor (a list, a barrier)
    bytes: Count
    site: Annotated[str, Meta(max_length=200)]  # "`function` (file.py:line)"
    digest: Annotated[int, Meta(ge=0, le=0xFFFF)]


class Window(_Message, frozen=True, kw_only=True, tag="window", gc=False):
    """What one rank did during one reporting window (default 1 s).

    Times are seconds, memory is bytes.  ``loader_wait_s`` and
    ``step_time_sum_s`` are totals over the steps that ended in the window, so
    their ratio is the loader-wait share.  The DDP figures (``forward_s`` …
    ``overlap_s``) are per step: the mean over ``ddp_steps`` iterations, or,
    when that is None, DDP's latest sampled iteration.
    """

    TYPE: ClassVar[str] = "window"

    v: Literal[1] = PROTOCOL_VERSION

    run_id: Text
    rank: Count
    seq: Count
    t0: float  # unix time, start of the window
    t1: float  # unix time, end of the window
    steps: Count = 0  # optimizer steps that ended in the window
    step_total: Count = 0  # steps since the reporter started, this one included
    # Steps with a known duration: a reporter's first step has none.  The time
    # totals (step_time_sum_s, loader_wait_s) cover these; None means all steps.
    timed_steps: Count | None = None
    step_time_sum_s: Seconds = 0.0
    step_time_p50_s: float | None = None
    step_time_p95_s: float | None = None
    step_time_max_s: float | None = None
    step_sketch: dict[Bucket, Count] = {}  # noqa: RUF012 - msgspec copies mutable defaults. {bucket: steps}
    slow_steps: SlowSteps = ()  # the window's slowest steps: (duration, loader wait), slowest first
    # Their step numbers (the reporter's count, as step_total), in the same order; () from older reporters.
    slow_step_numbers: SlowStepNumbers = ()
    # Recordings of the first protocol only; new reporters send step_sketch.
    step_hist: dict[LegacyBucket, Count] = {}  # noqa: RUF012 - msgspec copies mutable defaults
    gpu_step_time_p50_s: float | None = None  # CUDA events between step marks
    # For some of the window's steps (by number, as slow_step_numbers): seconds from the step's start to the
    # end of its last training forward, when the rank was ready to exchange gradients.  Compared step by
    # step across ranks, they say which rank the others waited for in each step.  () from older reporters.
    ready_step_numbers: ReadyStepNumbers = ()
    ready_s: ReadyTimes = ()
    # For the same steps, how long that last training forward took: what the rank's readiness owes to its
    # work in the step (a longer batch) rather than to what came before it.  () where not timed.
    ready_forward_s: ReadyTimes = ()
    # And how many elements that forward's input held (its first tensor argument): a batch padded to its
    # longest text is as long as that text, so a forward that takes longer with a larger input is the data's
    # doing, not the machine's.  () where not known; only beside ready_forward_s.
    ready_input_numel: ReadyStepNumbers = ()
    # For some of the window's steps (by number, thinned as ready_step_numbers are): the step's time less what
    # the rank waited in collectives during it, its own work.  Where collectives run through the whole step
    # (FSDP2's all-gathers before each block, TP's all-reduce in each layer, ZeRO), every rank leaves each one
    # together, so the rank with the most own work is the one the others waited for, whatever its readiness for
    # a final exchange says.  On CUDA from events on the compute stream (the GPU clock).  () where not timed.
    work_step_numbers: ReadyStepNumbers = ()
    work_s: ReadyTimes = ()
    loader_wait_s: Seconds = 0.0
    loader_batches: Count = 0
    # In the optimizer's step (its pre- to post-hook), summed over the same steps as step_time_sum_s;
    # None: no optimizer hook timed one (an older reporter, or no torch.optim optimizer).
    optimizer_s: Seconds | None = None
    # The FLOPs of the steps whose work was counted (forward and backward, once per input shape: docs/mfu.md), the
    # time those steps took and how many they were; steps run under the counting itself are left out.  None: none.
    flops_sum: Annotated[float, Meta(ge=0.0)] | None = None
    flops_time_s: Seconds | None = None
    flops_steps: Count | None = None
    samples: Count | None = None  # steps × batch size, when the batch size is known
    forward_s: float | None = None
    backward_s: float | None = None  # backward compute
    comm_s: float | None = None  # gradient all-reduce, start to end
    overlap_s: float | None = None  # part of comm hidden behind backward compute
    forwards: Count | None = None  # forwards of the watched model with autograd on: micro-batches
    # The window's collectives by kind and group, totals over its steps, from whatever issued them (FSDP2,
    # DTensor, DeepSpeed, the user's own calls): docs/communication.md.  () when none was timed.  Where DDP's
    # logger does not time the step (any other stack), forward_s … overlap_s come from the same source.
    collectives: Collectives = ()
    # Each group's collectives issued through the tap since the last window, digested (issue #55), and what the
    # digests seen for the first time stand for.  () from older reporters, or with no collector listening.
    digests: Annotated[tuple[GroupDigests, ...], Meta(max_length=16)] = ()
    digest_sites: Annotated[tuple[DigestSite, ...], Meta(max_length=MAX_DIGEST_SITES)] = ()
    # How those phase figures were measured: "ddp" (DDP's logger), "hooks" (module hooks and the timed
    # collectives, on the host's clock), "cuda events" (events at the same marks and around the collectives'
    # waits on the compute stream: the GPU's clock); None from older reporters, which only had DDP's.
    phases_from: Text | None = None
    # torch.compile, from dynamo's own counters (docs/communication.md#torchcompile): in this window,
    compiles: Count | None = None  # frames compiled (a first compile or a recompile)
    recompiles: Count | None = None  # of which recompiles (a guard failed: a new shape, dtype, …)
    compile_s: Seconds | None = None  # time spent compiling
    graph_breaks: Count | None = None  # graph breaks seen so far (a running count)
    ddp_iteration: Count | None = None  # DDP's iteration the figures come from (the last one)
    ddp_steps: AtLeastOne | None = None  # iterations the DDP figures average; None: one sampled iteration
    mem_allocated_bytes: Count | None = None
    mem_reserved_bytes: Count | None = None
    mem_peak_bytes: Count | None = None
    mem_total_bytes: Count | None = None
    alloc_retries: Count | None = None
    ooms: Count | None = None
    cpu_pct: float | None = None  # the rank process, 100 = one core
    rss_bytes: Count | None = None
    threads: Count | None = None
    workers: Count | None = None  # live DataLoader worker processes
    workers_cpu_pct: float | None = None
    # Run-queue wait in the window (ready to run, no CPU free), from /proc/<pid>/task/<tid>/schedstat:
    main_cpu_wait_s: Seconds | None = None  # the training thread
    cpu_wait_s: Seconds | None = None  # the rank's compute threads together (gloo's and NCCL's own left out)
    cpu_run_s: Seconds | None = None  # the CPU time of those same threads
    workers_cpu_wait_s: Seconds | None = None  # all the DataLoader workers' threads together
    dropped: Count = 0  # windows this reporter had to drop so far
    # What gputop itself cost the rank in this window (self-accounting):
    reporter_cpu_s: float | None = None  # CPU time of the reporter thread
    hook_s: float | None = None  # training-thread time in gputop's step marks and loader bookkeeping (calibrated)
    sent_bytes: Count | None = None  # bytes written to the dashboard's socket

    def __post_init__(self) -> None:
        # The checks no annotation can say: the counts, sizes and durations are typed non-negative.
        if self.t1 < self.t0:
            raise ValueError("window times must not run backwards")
        if len(self.ready_s) != len(self.ready_step_numbers):
            raise ValueError("ready_s and ready_step_numbers must name the same steps")
        if self.ready_forward_s and len(self.ready_forward_s) != len(self.ready_s):
            raise ValueError("ready_forward_s must time the steps ready_s names, or none")
        if self.ready_input_numel and len(self.ready_input_numel) != len(self.ready_forward_s):
            raise ValueError("ready_input_numel must size the forwards ready_forward_s times, or none")
        if len(self.work_s) != len(self.work_step_numbers):
            raise ValueError("work_s and work_step_numbers must name the same steps")

    @property
    def duration_s(self) -> float:
        return max(self.t1 - self.t0, 1e-9)

    @property
    def timed(self) -> int:
        """How many steps the time totals cover."""
        return self.steps if self.timed_steps is None else self.timed_steps

    @property
    def step_time_mean_s(self) -> float | None:
        return self.step_time_sum_s / self.timed if self.timed > 0 else None

    @property
    def exposed_comm_s(self) -> float | None:
        """Communication not hidden behind backward compute, per step."""
        if self.comm_s is None:
            return None
        return max(self.comm_s - (self.overlap_s or 0.0), 0.0)


class Event(_Message, frozen=True, kw_only=True, tag="event"):
    """Something that happened once: an OOM, a reporter-internal error, a note."""

    TYPE: ClassVar[str] = "event"

    v: Literal[1] = PROTOCOL_VERSION

    run_id: Text
    rank: Count
    t: float
    kind: Text
    message: Text = ""


class Bye(_Message, frozen=True, kw_only=True, tag="bye"):
    """A rank's reporter shutting down cleanly (the process is exiting), and what ended it."""

    TYPE: ClassVar[str] = "bye"

    v: Literal[1] = PROTOCOL_VERSION

    run_id: Text
    rank: Count
    t: float
    step_total: Count = 0
    dropped: Count = 0
    # "exit": the script ended; "signal": a signal ended it (``detail`` "SIGTERM", "SIGINT"); "exception": an
    # uncaught exception did (``detail`` "RuntimeError: …").  gputop/reporter/ending.py, sigterm.py.
    how: Literal["exit", "signal", "exception"] = "exit"
    detail: Text = ""
