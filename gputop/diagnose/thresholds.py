"""Every number a diagnosis rule compares against, with where it comes from.

A threshold is justified by its source, not by a demo.  Where the source is an
existing tool's rule, it is named; where it is gputop's own judgement, the
reasoning is written beside it.  docs/diagnosis.md lists the same numbers (a
test checks that each constant named there exists here).  Shares are fractions
of wall step time (0.05 = 5%); CPU percentages are of one core (100 = one core).
"""

from __future__ import annotations

# --- evidence needed at all ----------------------------------------------------

# A share of step time over fewer steps is noise (a first step that compiles,
# one checkpoint save).  Three is the fewest that makes a median mean something.
MIN_STEPS = 3

# --- data_loading --------------------------------------------------------------

# PyTorch profiler TensorBoard plugin (torch-tb-profiler, RunProfileData.analyze):
# "This run has high time cost on input data loading" when DataLoader time is
# more than 5% of the step.
LOADER_WAIT_WARN_FRAC = 0.05
# gputop: at a fifth of every step the GPU idles more than it would from any
# other single cause we rank; four times the profiler's line.
LOADER_WAIT_CRITICAL_FRAC = 0.20
# gputop: a DataLoader worker is one process; at 90% of a core on average it has
# no headroom left (psutil's per-process percentages jitter by a few points).
WORKER_SATURATED_PCT = 90.0
# PyTorch DataLoader docs ("Single- and Multi-process Data Loading") and the
# performance tuning guide: start with a few workers, 4 per GPU is the common
# starting point; we never suggest more than the rank's share of the CPUs.
SUGGESTED_MIN_WORKERS = 4

# --- communication -------------------------------------------------------------

# torch-tb-profiler, RunProfileData.analyze: "This run has high time cost on
# communication" when communication is more than 10% of the step.  We apply it
# to *exposed* communication (not hidden behind backward compute).
EXPOSED_COMM_WARN_FRAC = 0.10
# gputop: beyond 30% exposed, gradient exchange costs about as much as the
# backward pass of a typical model (backward ~ 2x forward, ~1/3 of a step).
EXPOSED_COMM_CRITICAL_FRAC = 0.30

# gputop: the finding names the collectives that hold training up, the most exposed first, at most
# this many, and besides the first only one with at least this part of the rank's exposed time: a
# name is worth reading where fixing that one collective is worth a fifth of the wait.
COLLECTIVES_NAMED = 2
COLLECTIVE_NAMED_PART = 0.2
# The DeviceMesh dimension names PyTorch's tensor-parallel tutorials and torchtitan give the group whose
# collectives sit inside every layer (the column/row-parallel linears' all-reduce or all-gather).
TENSOR_PARALLEL_GROUPS = frozenset({"tp", "tensor", "model", "sp", "cp"})

# --- straggler -----------------------------------------------------------------

# A rank is slow when its own time (step time minus exposed comm) exceeds the
# other ranks' median by more than STRAGGLER_WAIT_WARN_FRAC of its step: DDP
# synchronizes every step, so that excess is what the others wait for it, and
# it is graded like communication, whose cost it is.  The others' wait beyond
# the slow rank's own exposed comm (the exchange's base cost) sets the severity.
STRAGGLER_WAIT_WARN_FRAC = EXPOSED_COMM_WARN_FRAC
STRAGGLER_WAIT_CRITICAL_FRAC = EXPOSED_COMM_CRITICAL_FRAC
# gputop: a straggler is a lasting property of a rank (its host, device or
# data).  In a run's first seconds ranks differ for passing reasons: one
# finishes its imports or fills its caches later, and on a small machine the
# dashboard's own start takes one rank's core.  CI twice saw a healthy 2-rank
# run's rank 0 compute ~28% slower for ~4 s after its first steps, then not.
# So a live span (the dashboard's last seconds) names no straggler above info
# until the run has been seen this long: by then the span holds none of its start.
STRAGGLER_WARMUP_S = 20.0

# --- stall ---------------------------------------------------------------------

# A stall is a step of at least STALL_FACTOR (3) x the median (gputop.model.stalls).
# gputop: time lost to stalls is graded like loader wait, which it resembles
# (the device idles while one thing finishes): torch-tb-profiler's 5% line and
# gputop's 20%.
STALL_WARN_FRAC = LOADER_WAIT_WARN_FRAC
STALL_CRITICAL_FRAC = LOADER_WAIT_CRITICAL_FRAC
# gputop: one long step is an event, two make a pattern worth naming.
STALL_MIN_COUNT = 2
# gputop: a stop shorter than this is the scheduler's, not the script's: a time slice lost on a shared core is
# up to ~10-20 ms (a 2-ms step "stopping 7 ms" 6 times in 40 is jitter), while a save, an evaluation or a
# collection worth naming takes tens of milliseconds or more.
STALL_MIN_STOP_S = 0.03

# --- recompile -------------------------------------------------------------------

# gputop: one recompile is an event (an epoch's short last batch, eval mode), two make a pattern: the
# inputs change in a way the compiled graphs do not cover.
RECOMPILE_MIN_COUNT = 2
# gputop: time spent recompiling idles the device like a stall does, and is graded like one.
RECOMPILE_WARN_FRAC = STALL_WARN_FRAC
RECOMPILE_CRITICAL_FRAC = STALL_CRITICAL_FRAC
# gputop: a rank that spent at least half of the stalls' extra time waiting in
# exposed comm was waiting for another rank that stopped; the others stopped.
STALL_IN_COMM_FRAC = 0.5
# gputop: a stall spent at least half waiting for the batch is the loader's.
STALL_LOADER_FRAC = 0.5

# --- parallelism ---------------------------------------------------------------

# torch-tb-profiler, RunProfileData._analyze_gpu_metrics: "GPU … has low
# utilization. You could try to increase batch size" when utilization < 50%.
GPU_UTIL_LOW_WARN_PCT = 50.0
# gputop: under a quarter busy, three quarters of the GPU are paid for and idle.
GPU_UTIL_LOW_CRITICAL_PCT = 25.0
# gputop: the Python main thread of a CUDA rank at 90% of one core cannot issue
# kernels any faster; psutil jitter makes 100% unreachable as a test.
MAIN_THREAD_BUSY_PCT = 90.0
# gputop: the GPU is busy less than half of each wall step.
GPU_STEP_OVER_WALL_STEP_RATIO = 0.5
# CUDA kernel launches cost ~5-10 us of host time each and PyTorch eager adds
# ~10 us of dispatch per op (PyTorch performance tuning guide, "CUDA graphs";
# NVIDIA CUDA best practices).  A training step issues hundreds of ops, so a
# step under 10 ms is mostly fixed per-step overhead, under 2 ms all of it.
TINY_STEP_WARN_S = 0.010
TINY_STEP_CRITICAL_S = 0.002
# gputop: only call a step "too little work" when the batch is also small; a
# long-sequence LLM step at batch 8 is not small, so the step time must agree.
SMALL_BATCH_SIZE = 32
# gputop (issue #46): the share of its device's peak FLOP/s a step's compute reaches (MFU over the step less
# the time other causes take).  At or above ENOUGH the step does its device's worth of work and is never called
# short, whatever its length: tuned GPU training reads 30-55% (torchtitan, Megatron, MosaicML's published MFU),
# and on a CPU a 1024-wide MLP at batch 1024 reads ~68% of the rank's measured matmul peak, a 4-block,
# 192-wide FSDP2 Transformer at batch 32 x 16 tokens 35-50% (docs/diagnosis.md).  Under LITTLE the step does
# little work for its device, the evidence that names too little work: a 2-block, 32-wide GPT at batch 2 reads
# ~6% here.
WORK_ENOUGH_MFU = 0.20
WORK_LITTLE_MFU = 0.10
# gputop: a GPU whose kernels run this share of the time (NVML utilization) but whose step reaches under
# WORK_LITTLE_MFU of its peak runs small kernels: busy launching, not computing.
GPU_UTIL_BUSY_PCT = 80.0

# --- model_config --------------------------------------------------------------

# torch-tb-profiler recommends Automatic Mixed Precision when tensor-core
# eligible kernels run in fp32 on compute capability >= 7.0; TF32 exists from
# Ampere (8.0) on (PyTorch CUDA semantics, "TensorFloat-32 (TF32) on Ampere
# (and later) devices").  Hello has no compute capability, so these name
# fragments stand in for it (lower-cased substrings of the device name).
TENSOR_CORE_GPU_NAMES = (
    "v100", "t4", "titan v", "titan rtx", "rtx 20", "quadro rtx", "a100", "a10", "a30", "a40",
    "a16", "a2", "rtx a", "rtx 30", "rtx 40", "rtx 50", "l4", "l40", "h100", "h200", "h800",
    "gh200", "b100", "b200", "gb200", "rtx 6000 ada",
)  # fmt: skip
AMPERE_OR_NEWER_GPU_NAMES = (
    "a100", "a10", "a30", "a40", "a16", "a2", "rtx a", "rtx 30", "rtx 40", "rtx 50",
    "l4", "l40", "h100", "h200", "h800", "gh200", "b100", "b200", "gb200", "rtx 6000 ada",
)  # fmt: skip

# --- model_config: how DDP was built ---------------------------------------------

# PyTorch DDP notes: each bucket is one all-reduce, and a small collective costs
# its latency (tens of microseconds on NCCL, more on gloo) whatever its size;
# DDP's default bucket_cap_mb is 25.  Sixteen buckets averaging under 1 MiB is
# a cap set far below the gradients' scale (gputop's judgement).
DDP_MANY_BUCKETS = 16
DDP_SMALL_BUCKET_BYTES = 1 << 20
# gputop: gradient_as_bucket_view=False copies every gradient into its bucket each
# step; worth an info line once the gradients are 64 MiB or more.
DDP_BIG_GRADIENT_BYTES = 64 << 20

# --- memory --------------------------------------------------------------------

# torch-tb-profiler, RunProfileData.analyze: "memory peak … is close to the GPU
# memory" when peak > 90% of totalGlobalMem (suggests activation checkpointing).
MEM_PEAK_WARN_FRAC = 0.90
# gputop: past 97% the caching allocator's own rounding (2 MiB blocks, 20 MiB
# large-block segments) leaves no room: the next larger batch is an OOM.
MEM_PEAK_CRITICAL_FRAC = 0.97
# PyTorch CUDA semantics / torch.cuda.memory_stats: num_alloc_retries counts
# cudaMalloc failures that forced the allocator to free its cache and retry, a
# synchronizing operation.  Any new retry is worth a warning; one every few
# steps is thrashing.
ALLOC_RETRIES_WARN = 1
ALLOC_RETRIES_CRITICAL_PER_STEP = 0.1
# gputop: reserved at least twice allocated, and by at least 1 GiB, is cache held
# by fragmentation (PyTorch CUDA semantics suggests
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True for this).
RESERVED_OVER_ALLOCATED_RATIO = 2.0
RESERVED_MINUS_ALLOCATED_MIN_BYTES = 1 << 30
# gputop: a peak under 40% of the GPU's memory leaves room to more than double
# the activations (the usual majority of training memory): info only.
MEM_PEAK_UNUSED_FRAC = 0.40

# --- allocation ----------------------------------------------------------------

# torchrun sets OMP_NUM_THREADS=1 for each process "to avoid your system being
# overloaded"; the PyTorch CPU performance tuning guide keeps threads <= cores.
# More runnable torch threads than cores on a host is oversubscription (warn);
# twice as many means each thread runs at most half of the time (critical).
THREADS_PER_CORE_WARN = 1.0
THREADS_PER_CORE_CRITICAL = 2.0
# gputop: the host's CPUs at over 90% busy corroborate oversubscription (shown
# as evidence beside the thread count; it never fires a finding on its own).
HOST_CPU_BUSY_PCT = 90.0
# gputop: of the time the ranks' threads and workers were ready to run, the
# share they waited for a CPU (run-queue wait from schedstat).  At a quarter,
# every CPU-bound phase of the step runs a third slower than it could (wait /
# run = 1/3), as much as the communication warn line costs; Linux's scheduler
# gives that at a load of 4 runnable threads per 3 cores.  At half, the job gets
# a CPU only half the time it wants one.
CPU_STARVED_WARN_FRAC = 0.25
CPU_STARVED_CRITICAL_FRAC = 0.50
# gputop: the wait alone is not oversubscription.  Two single-threaded ranks on
# 2 cores, exactly subscribed, measured 24-37% here (scheduling latency, gloo's
# threads, the test harness): a share that flips around any line.  So the CPUs
# must also be oversubscribed: the threads ready to run (the ranks', their
# workers', and the busy processes outside the job where the host is sampled)
# over 1.25x the cores, where Linux's fair scheduler makes each wait ~20%.
CPU_DEMAND_OVER_CORES = 1.25
# gputop: a process outside the job is worth naming as competition for the
# job's CPUs once it uses a quarter of a core on average.
OTHER_PROCESS_CPU_PCT = 25.0
# gputop: a process outside the job that takes half a core or more is a
# competitor by itself: the ranks past CPU_STARVED_WARN_FRAC wait behind it
# whatever the job's own demand (a busy loop on one core of a 2-core host
# starved the rank beside it 36% and the other 21%, issue #22).
OUTSIDE_COMPETITOR_CPU_PCT = 50.0
# gputop: another process on the job's GPU matters when it computes (NVML's
# per-process SM utilization above noise) or holds real memory.
OTHER_PROCESS_SM_PCT = 5.0
OTHER_PROCESS_MIN_BYTES = 512 << 20

# hang: no live rank has finished a step for max(HANG_MIN_S, HANG_STEP_FACTOR x its median step,
# HANG_LONGEST_FACTOR x its longest recent step).  The floor keeps a job of 50-ms steps from
# reading as hung during a 2-s checkpoint; the longest-step factor does the same for a job
# whose evaluation or save takes longer than the floor.  A rank that spends more than
# HANG_BUSY_CPU_PCT of a core meanwhile is computing, not blocked: warn, not critical.
HANG_MIN_S = 5.0
HANG_STEP_FACTOR = 10.0
HANG_LONGEST_FACTOR = 2.0
HANG_BUSY_CPU_PCT = 50.0
