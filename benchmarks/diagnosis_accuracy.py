"""How often gputop names the right cause: a corpus of real 2-rank CPU DDP jobs, each run K times.

Every case is a job written the way users write them (benchmarks/jobs/accuracy/),
run under ``torchrun --nproc_per_node=2`` (gloo) beside an in-process collector
that records it, then reported with ``gputop report FILE --format json``.  It
prints the confusion table (expected cause x the top warn/critical finding's
cause; "healthy" when there is none; a run is right when that finding also names
the ranks the case's cause is on, and the right cause on other ranks is counted
in a column of its own), the flip rate (cases whose K identical runs disagree),
and, for cases whose cause switches on mid-run, how long after the onset the
live dashboard (the recording replayed through the persistent diagnoser) first
shows it.  A healthy case's run is also replayed so: one whose live view showed a
warning at any refresh, or called a rank slow at all, is not right, whatever its
report says, since that warning is what its user saw.  A run whose case never set
up what it tests is void, with why.

The corpus holds the bundled demo's scenarios too (``gputop demo``'s training
script, gputop/demos/train.py, as cases named demo_<scenario>), so a newcomer's
first look at each is checked on fresh runs.

Run: .venv/bin/python benchmarks/diagnosis_accuracy.py [--runs 3] [--cases a,b] [--seconds 14] [--out results.json]
     [--keep DIR]  (keeps each run's recording and job log, for `gputop report` or `gputop replay`)
     [--condition quiet|neighbour|one_core] [--rescore DIR]  (reports a --keep DIR's recordings, runs no job)

Conditions, so a verdict is checked on more than the machine it was tuned on:

- ``quiet``: the job alone;
- ``neighbour``: a CPU-bound process that is not the job's, pinned to core 0, for each run;
- ``one_core``: torchrun and its ranks pinned to core 0 between them (a slower machine).

Under ``neighbour`` and ``one_core`` the ranks measurably wait for a CPU, so for a case
that is otherwise healthy the right top finding is ``allocation``.  Every other case is
right with its own cause on top, or with ``allocation`` on top when its own cause is still
among the findings (warn or critical, or kept as info under the allocation finding as its
symptom): both are true then, and which is worth fixing first depends on magnitudes the
case does not set.  What is wrong is the case's cause gone, or a third cause on top.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import gputop.demos
from gputop import settings
from gputop.address import Address
from gputop.collect import recording
from gputop.collect.live import LiveSource
from gputop.diagnose.findings import Finding
from gputop.diagnose.persistence import Diagnoser
from gputop.diagnose.rules.cpu_contention import busy_others
from gputop.model.figures import summarize
from gputop.model.snapshot import SNAPSHOT_HISTORY_WINDOWS

JOBS = Path(__file__).resolve().parent / "jobs" / "accuracy"
DEMO_TRAIN = Path(gputop.demos.__file__).resolve().parent / "train.py"  # the script `gputop demo` runs under torchrun
ONSET_FILE_ENV = "GPUTOP_BENCH_ONSET_FILE"  # as in jobs/accuracy/common.py
HEALTHY = "healthy"  # the top-cause column when no warn/critical finding shows
REFRESH_S = settings.REFRESH_S.default  # the dashboard's default refresh: the replay diagnoses this often


@dataclass(frozen=True)
class Case:
    name: str
    expected: str  # a finding cause, or "healthy"
    about: str
    script: str = "job.py"
    demo: str = ""  # the bundled demo's scenario the case runs (DEMO_TRAIN), in place of a corpus job
    seconds: float | None = None  # training time, whatever the run's --seconds (a first minute is a minute)
    onset: bool = False  # the cause switches on mid-run; the job writes when
    unseen: bool = False  # written after the rules, to score them on jobs they were not tuned on
    # The step the case's own ranks (``ranks``; every rank where it names none) must reach for its cause to
    # happen at all (a hang that begins at step 10): a run that stopped short is void, neither right nor wrong.
    # Only theirs: a rank that waits for a hung one goes silent before it reports its last steps (gloo holds the
    # GIL in the all-reduce), and that is part of what the case shows, not a premise that failed.
    premise_step: int = 0
    # Why the case's premise needs a GPU, where it does ("" where it does not): a run on the CPU is then void.
    gpu_premise: str = ""
    # The job is meant to end by a signal or a failure (a hung job SIGTERMed, a collective's timeout): its exit
    # status is how it ends, not an error of the run.
    ends_failed: bool = False
    # The ranks a right verdict names as the cause (the finding's "ranks", see named_ranks): what a user reads
    # and goes to fix.  () for a cause no one rank has (a rotating straggler);
    # None where the job does not decide which ranks (a healthy job, a neighbour the kernel places).
    ranks: tuple[int, ...] | None = None
    # The job starts a program of its own beside it (another user's, as far as the job can tell): its premise,
    # not a neighbour that makes a quiet run void (``neighbour_seen``).
    own_neighbour: bool = False

    def expected_under(self, condition: str) -> str:
        """The right top finding under a condition: a healthy job short of CPU is an allocation problem."""
        return "allocation" if condition != "quiet" and self.expected == HEALTHY else self.expected

    def under(self, condition: str) -> Case:
        """The case as scored under a condition.  A healthy job short of CPU is an allocation problem, and which
        of its ranks waits most is the kernel's placement of the neighbour, not the job's: ranks not checked."""
        if self.expected_under(condition) == self.expected:
            return self
        return replace(self, expected=self.expected_under(condition), ranks=None)


# Every rank of the corpus's 2-rank jobs: the ranks a right finding names when each rank has the cause itself.
ALL_RANKS = (0, 1)

CASES: tuple[Case, ...] = (
    # Both ranks' loaders are slow the same way (a 1-worker DistributedSampler loader reading 4 ms a sample; a
    # stream each rank reads in its main process; a cache every rank loses at 40% of the run): each rank waits
    # for its own data, so a right finding names both.
    Case(
        "data_loading_sleepy_worker",
        "data_loading",
        "DistributedSampler, 1 worker, 4 ms read per sample",
        ranks=ALL_RANKS,
    ),
    Case(
        "data_loading_stream_main_process",
        "data_loading",
        "IterableDataset in the main process, 3 ms a record",
        ranks=ALL_RANKS,
    ),
    Case("data_loading_onset", "data_loading", "loader turns slow at 40% of the run", onset=True, ranks=ALL_RANKS),
    # One model, one gradient all-reduce both ranks wait in: a right finding names both.
    Case("communication_wide_mlp", "communication", "2048-wide MLP + LayerNorm, batch 16", ranks=ALL_RANKS),
    Case("communication_embedding_table", "communication", "250k x 64 dense EmbeddingBag, batch 32", ranks=ALL_RANKS),
    Case("straggler_slow_loader_rank1", "straggler", "rank 1's worker reads 6 ms a sample", ranks=(1,)),
    Case("straggler_extra_compute_rank1", "straggler", "rank 1 computes an 80-ms metric each step", ranks=(1,)),
    Case(
        "straggler_slow_optimizer_rank1",
        "straggler",
        "rank 1's optimizer step keeps parameter statistics, 40 ms",
        ranks=(1,),
    ),
    # Batch 2 and 4 on every rank: each rank's step is too small, so a right finding names both.
    Case("parallelism_tiny_mlp", "parallelism", "16-32-4 MLP, batch 2", ranks=ALL_RANKS),
    Case("parallelism_tiny_bag_of_words", "parallelism", "1000 x 16 EmbeddingBag, batch 4", ranks=ALL_RANKS),
    # Each rank asks for 3 threads, or runs 2 FFT workers: every rank oversubscribes, so a right finding names both.
    Case(
        "allocation_threads_oversubscribed", "allocation", "3 torch threads per rank, 2 ranks, 2 cores", ranks=ALL_RANKS
    ),
    Case(
        "allocation_workers_cpu_transform",
        "allocation",
        "2 ranks x 2 workers with an FFT augmentation, 2 cores",
        ranks=ALL_RANKS,
    ),
    Case("stall_checkpoint_rank0", "stall", "rank 0 saves a checkpoint + 2 s flush every 5 steps", ranks=(0,)),
    # Every rank runs the same evaluation every 10 steps (rank 0 only prints the result): both stop.
    Case("stall_periodic_evaluation", "stall", "all ranks evaluate 1536 images every 10 steps", ranks=ALL_RANKS),
    # DDP's settings are the script's, the same on every rank: a right finding names both.
    Case("model_config_find_unused", "model_config", "find_unused_parameters=True, none unused", ranks=ALL_RANKS),
    Case(
        "model_config_tiny_buckets",
        "model_config",
        "bucket_cap_mb=0.001 on a 40-layer convnet: ~40 buckets",
        ranks=ALL_RANKS,
    ),
    Case("healthy_convnet", HEALTHY, "CIFAR convnet, DistributedSampler with set_epoch"),
    Case(
        "healthy_accumulation_manual_marks",
        HEALTHY,
        "convnet, 4 micro-batches of 32 in no_sync, 1 worker, gputop.step()",
    ),
    Case(
        "healthy_lightning",
        HEALTHY,
        "Lightning Trainer(strategy='ddp', max_time=...), convnet",
        script="lightning_case.py",
    ),
    # Written like public scripts and added before any rule was tuned to them (jobs/accuracy/unseen_cases.py).
    Case(
        "hang_rank1_lock",
        "hang",
        "rank 1 blocks on a lock for good at step 10",
        unseen=True,
        # Step 10 on rank 1, which blocks there; rank 0 then waits in its step-10 all-reduce holding the GIL
        # (gloo), and its reporter, silent from there, may not send its last windows (a quiet run reported 8/10).
        premise_step=10,
        ranks=(1,),
    ),
    # Issue #55's, added before their first scores were read: a hang's run ended by SIGTERM (every rank says bye)
    # or by gloo's timeout (rank 0 fails in the all-reduce), and a desync gloo goes on through.
    Case(
        "hang_rank1_lock_sigterm",
        "hang",
        "hang_rank1_lock, then SIGTERM to every rank",
        unseen=True,
        ends_failed=True,
        premise_step=10,
        ranks=(1,),
    ),
    Case(
        "hang_rank1_gloo_timeout",
        "hang",
        "rank 1 blocks at step 10; rank 0's all-reduce times out (8 s)",
        unseen=True,
        ends_failed=True,
        premise_step=10,
        ranks=(1,),
    ),
    Case(
        "desync_metric_dtype",
        "desync",
        "rank 1 all-reduces an int64 count where rank 0 sums a float64 loss",
        unseen=True,
        premise_step=10,
        ranks=(0, 1),
    ),
    Case(
        "straggler_metric_after_step_rank1",
        "straggler",
        "rank 1 computes a metric after optimizer.step()",
        unseen=True,
        ranks=(1,),
    ),
    # The hog is not pinned: which rank shares its core is the kernel's choice, and the rule names the ranks
    # that wait past its line (the one beside the hog, or both).  Not checked.
    Case(
        "allocation_outside_cpu_hog",
        "allocation",
        "healthy convnet, another program burns a core",
        unseen=True,
        ranks=None,
        own_neighbour=True,
    ),
    Case(
        "stall_checkpoint_every_10_rank0", "stall", "rank 0 saves every 10 steps, 1.5 s flush", unseen=True, ranks=(0,)
    ),
    # The flush steps are drawn from one seed, the same on every rank, and every rank sleeps: both stop.
    Case("stall_irregular", "stall", "every rank flushes logs ~1 s at irregular steps", unseen=True, ranks=ALL_RANKS),
    Case("healthy_symmetric_accumulation", HEALTHY, "4 micro-batches under no_sync, optimizer marks", unseen=True),
    Case("healthy_mingpt_like", HEALTHY, "minGPT-ddp scaled down: 2 blocks, AdamW, clipping", unseen=True),
    # Every rank tokenises its own batches in collate_fn, in its main process: both wait for data.
    Case(
        "data_loading_tokenize_in_collate",
        "data_loading",
        "Python tokenizer in collate_fn, 0 workers",
        unseen=True,
        ranks=ALL_RANKS,
    ),
    # Added with the step-by-step comparison of readiness (issue #25), scored before any rule was tuned to it.
    # The slowest rank is whichever drew the longest batch, step by step: no one rank is the cause.
    Case(
        "straggler_rotating_uneven_lengths",
        "straggler",
        "text classifier, batches padded to their longest text: the longest batch's rank is last",
        unseen=True,
        ranks=(),
    ),
    # Stacks beyond DDP (issue #34), written as their public examples are (jobs/accuracy/stack_cases.py) and
    # scored before any rule was tuned to them.
    Case(
        "fsdp2_healthy",
        HEALTHY,
        "pytorch/examples' FSDP2 Transformer: fully_shard per block, AdamW",
        unseen=True,
        # Healthy where FSDP2 issues its all-gathers on a stream of their own and computes meanwhile.  On gloo the
        # training thread waits every one out: 20% of each step at the example's batch 16, 12% at 64 (measured
        # by the collective tap, issue #35), so on the CPU the job is not healthy and nothing scores the rules.
        gpu_premise="FSDP2 hides its all-gathers behind compute only on a GPU (gloo's block the training thread)",
    ),
    Case(
        "fsdp2_straggler_metric_rank1",
        "straggler",
        "the FSDP2 job; rank 1 computes a Python metric after optimizer.step()",
        unseen=True,
        ranks=(1,),
    ),
    # Every rank gathers every block's parameters before its forward, unprefetched: both wait.
    Case(
        "fsdp2_exposed_all_gather",
        "communication",
        "FSDP2, 50-MB blocks at batch 2, resharded after forward, no prefetch",
        unseen=True,
        ranks=ALL_RANKS,
    ),
    # Both ranks are the one tp group, and each layer's all-reduce holds both.
    Case(
        "tp_group_critical_path",
        "communication",
        "(dp=1, tp=2) mesh, ColwiseParallel/RowwiseParallel MLP: a tp all-reduce in every layer",
        unseen=True,
        ranks=ALL_RANKS,
    ),
    # Every rank reads its own samples at 4 ms each in its main process: both wait for data.
    Case(
        "accelerate_loader_bound",
        "data_loading",
        "Accelerate plain loop (prepare, accelerator.backward), 4 ms a sample, 0 workers",
        unseen=True,
        ranks=ALL_RANKS,
    ),
    # Which rank meets a new length first is its shard's draw of texts, not the job's design (the first score
    # saw rank 0 alone recompile): not checked.
    # Issue #35: a tiny batch whose exchange is 20% of a short step; scored "communication" (warn, 22%) before
    # the rule that reads the exchange as the tiny step's symptom was written.  Every rank's step is small.
    Case(
        "parallelism_mingpt_batch2",
        "parallelism",
        "minGPT-like, 2 blocks 32 wide over 128 characters, batch 2 a rank, no workers",
        unseen=True,
        ranks=ALL_RANKS,
    ),
    Case(
        "compile_recompiling_padded_batches",
        "recompile",
        "DDP(torch.compile(model, dynamic=False)), padded to a sequence-length warm-up: 16, 32, 48, 64 tokens",
        unseen=True,
        # Four lengths by step (stack_cases.LengthWarmup), the same on every rank: three recompiles by step 25.
        # As first written (batches padded to their longest) one length came up and one recompile a rank, under
        # the rule's two; mostly short texts then made a data-driven rotation, not recompiles (issue #35).
        premise_step=30,
        ranks=None,
    ),
    # Issue #46: a long FSDP2 step whose all-gathers gloo cannot hide (it read "too little work per step at batch
    # 32" before the work was counted), and a DDP job whose every step does its CPU's worth of matmul work.
    Case(
        "fsdp2_all_gathers_unhidden",
        "communication",
        "FSDP2, 4 blocks of dim 192, batch 32 x 16 tokens: ~200-ms steps, a quarter of them all-gathers",
        unseen=True,
        ranks=ALL_RANKS,
    ),
    Case("healthy_compute_bound_mlp", HEALTHY, "1024-wide 4-layer MLP, batch 1024 a rank", unseen=True),
    # Issue #56's, scored before any rule changed for them (docs/journal/2026-12-diagnosis.md): pytorch/examples'
    # 2-D job (sequence and tensor parallel on tp, FSDP2 on dp) as it is, and with rank 1 doing matrix work between
    # its forward and its backward; and a run too short for three windows with a strong straggler in every step.
    Case("twod_healthy", HEALTHY, "Llama-like, SequenceParallel + TP on tp=2, FSDP2 on dp=1", unseen=True),
    Case(
        "twod_straggler_metric_between_passes_rank1",
        "straggler",
        "the 2-D job; rank 1 spends ~0.3 s on matrix work between forward and backward",
        unseen=True,
        ranks=(1,),
    ),
    Case(
        "straggler_short_run_rank1",
        "straggler",
        "3-s DDP run; rank 1 does 80% more work every step",
        seconds=3.0,
        unseen=True,
        ranks=(1,),
    ),
    Case(
        "parallelism_forty_tiny_steps",
        "parallelism",
        "16-32-4 MLP, batch 2, 40 steps only (well under a second)",
        unseen=True,
        ranks=ALL_RANKS,
    ),
    # Issue #55's: at one collective number rank 1's call differs (size; a barrier against the metric's
    # all-reduce), gloo waits for good, and each rank is SIGTERMed once the budget is spent.  A desync is on
    # both ranks: a right finding names both.
    Case(
        "desync_metric_size",
        "desync",
        "from step 10 rank 1 all-reduces 2 floats where rank 0 all-reduces 1; SIGTERM at the end",
        unseen=True,
        ends_failed=True,
        premise_step=10,
        ranks=ALL_RANKS,
    ),
    Case(
        "desync_barrier_meets_metric",
        "desync",
        "from step 10 rank 1 skips the metric's all-reduce for a barrier; SIGTERM at the end",
        unseen=True,
        ends_failed=True,
        premise_step=10,
        ranks=ALL_RANKS,
    ),
    # The bundled demo's scenarios, run by its own training script (DEMO_TRAIN, sized to the machine as `gputop
    # demo` sizes it): what a newcomer sees first.  Not unseen: the rules were tuned with the demos in view.
    Case("demo_healthy", HEALTHY, "demo: CIFAR convnet, batch 64, 0.25-MB buckets", demo="healthy"),
    # Every rank's input takes 60 ms a batch: each waits for its own, so a right finding names both.
    Case(
        "demo_slow_loader",
        "data_loading",
        "demo: 60 ms to load each batch, in the main process",
        demo="slow_loader",
        ranks=ALL_RANKS,
    ),
    Case("demo_straggler", "straggler", "demo: rank 1's input takes 60 ms a batch", demo="straggler", ranks=(1,)),
    # A rank drawn at random works 80 ms more each step: the others wait for a different one each time.
    Case("demo_rotating", "straggler", "demo: a random rank works 80 ms more each step", demo="rotating", ranks=()),
    # One model, one all-reduce both ranks wait in; every rank's step is too small; every rank oversubscribes.
    Case("demo_comm_bound", "communication", "demo: 4 x 2048-wide MLP, batch 8", demo="comm_bound", ranks=ALL_RANKS),
    Case("demo_small_batch", "parallelism", "demo: 2 x 32-wide MLP, batch 2", demo="small_batch", ranks=ALL_RANKS),
    Case(
        "demo_oversubscribed",
        "allocation",
        "demo: twice as many torch threads as cores",
        demo="oversubscribed",
        ranks=ALL_RANKS,
    ),
    # A newcomer's first minute of the healthy demo must show no warning: a minute, whatever --seconds says.
    Case("demo_healthy_minute", HEALTHY, "demo: the healthy scenario's first minute", demo="healthy", seconds=60.0),
)


@dataclass(frozen=True)
class RunResult:
    case: str
    expected: str
    run: int
    top: str  # the top warn/critical finding's cause, "healthy", or "error"
    top_title: str
    findings: tuple[str, ...]  # "severity cause: title" for each finding, worst first
    steps: tuple[int, ...]  # per rank
    wall_s: float
    onset_to_finding_s: float | None = None  # onset cases: when the expected cause first showed live
    before_onset: tuple[str, ...] = ()  # onset cases: warn/critical causes the live view showed before the onset
    # Healthy cases (quiet): what the live view showed at any refresh (see live_alarms); not right unless empty.
    shown_live: tuple[str, ...] = ()
    error: str = ""
    # Under a condition that takes CPUs: allocation named first, with the case's own cause still listed.
    allocation_first: bool = False
    # Why the case's premise did not happen in this run (its hang's step never reached, its onset never
    # written): then the run is void, scored neither right nor wrong.  "" when it happened.
    void: str = ""
    on_cpu: bool = False  # every rank reported its device as the CPU
    # The ranks the scored finding names as the cause (the top one's; under allocation first, the case's own
    # finding's), and the ranks the case says a right one names (None: not checked).
    named: tuple[int, ...] = ()
    ranks_expected: tuple[int, ...] | None = None

    @property
    def cause_right(self) -> bool:
        """The cause a user reads first is the case's (or allocation, with the case's own cause listed).

        A healthy run whose live view showed a warning is not right even if its report is clean: the warning
        is what its user read first.
        """
        return not self.void and not self.shown_live and (self.top == self.expected or self.allocation_first)

    @property
    def ranks_right(self) -> bool:
        return self.ranks_expected is None or self.named == self.ranks_expected

    @property
    def right(self) -> bool:
        """The cause right and, where the case says, the ranks it names as the cause too."""
        return self.cause_right and self.ranks_right

    @property
    def ranks_wrong(self) -> bool:
        """The right cause, pinned on the wrong ranks: a user goes to fix the wrong process."""
        return self.cause_right and not self.ranks_right


def named_ranks(finding: dict[str, Any]) -> tuple[int, ...]:
    """The ranks a finding names as the cause: the report's "ranks" (what the dashboard and an alert show).

    A stall or a straggler leaves the ranks that only wait for it out of them (its title says where they wait);
    a hang puts in every rank that stopped stepping or reporting.
    """
    return tuple(sorted(int(r) for r in finding.get("ranks") or ()))


def premise_missing(case: Case, steps: tuple[int, ...], onset_path: Path, *, on_cpu: bool = False) -> str:
    """Why a run of ``case`` never set up what it tests, or "" when it did."""
    if case.gpu_premise and on_cpu:
        return f"{case.gpu_premise}; this run was on the CPU"
    own = [steps[rank] for rank in case.ranks or () if rank < len(steps)] or list(steps)  # steps: rank order
    if case.premise_step and (not own or min(own) < case.premise_step):
        reached = min(own) if own else 0
        return f"the job reached step {reached} of the {case.premise_step} its cause begins at"
    if case.onset and not onset_path.exists():
        return "the job never wrote its onset: the cause never switched on"
    return ""


CONDITIONS = ("quiet", "neighbour", "one_core")
BURN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"


def on_core_0() -> None:
    os.sched_setaffinity(0, {0})


@contextlib.contextmanager
def neighbour(condition: str, seconds: float) -> Iterator[None]:
    """Under ``neighbour``: a busy loop pinned to core 0, in a session of its own, for the run."""
    if condition != "neighbour":
        yield
        return
    hog = subprocess.Popen([sys.executable, "-c", BURN.format(seconds=seconds)], preexec_fn=on_core_0,
                           start_new_session=True)  # fmt: skip
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def run_job(case: Case, seconds: float, work: Path, run: int, condition: str = "quiet") -> RunResult:
    """Run one case once under torchrun beside a recorder; report the recording."""
    seconds = seconds if case.seconds is None else case.seconds
    rec_path = work / f"{case.name}.{run}.jsonl"
    onset_path = work / f"{case.name}.{run}.onset"
    log_path = work / f"{case.name}.{run}.log"
    recorder = recording.Recorder(rec_path, source="diagnosis_accuracy")
    source = LiveSource(Address(port=0), sample_interval_s=1.0, recorder=recorder)
    started = time.monotonic()
    code: int | None = None
    try:
        source.start()
        cmd = job_command(case, seconds)
        env = {**os.environ, "GPUTOP_PORT": str(source.address.port), "PYTHONUNBUFFERED": "1",
               ONSET_FILE_ENV: str(onset_path)}  # fmt: skip
        env.pop("GPUTOP_SOCKET", None)
        with open(log_path, "wb") as log, neighbour(condition, seconds + 180):
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True,
                                    preexec_fn=on_core_0 if condition == "one_core" else None)  # fmt: skip
            try:
                code = proc.wait(seconds + 120)
            except subprocess.TimeoutExpired:
                stop_group(proc)
        time.sleep(0.3)  # the ranks' last windows are sent at exit
    finally:
        source.stop()
        recorder.close()
    wall_s = time.monotonic() - started
    if code != 0 and not (case.ends_failed and code is not None):
        tail = " | ".join(log_path.read_text(errors="replace").splitlines()[-3:])
        why = "timed out" if code is None else f"exit {code}"
        return RunResult(case.name, case.expected, run, "error", "", (), (), wall_s, error=f"{why}: {tail}",
                         ranks_expected=case.ranks)  # fmt: skip
    return read_run(case, run, rec_path, onset_path, wall_s, condition)


def job_command(case: Case, seconds: float) -> list[str]:
    """torchrun's command for one run: the case's corpus job, or the bundled demo's script as a file."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    if case.demo:
        return [*torchrun, str(DEMO_TRAIN), "--scenario", case.demo, "--seconds", str(seconds)]
    which = ["--case", case.name] if case.script == "job.py" else []
    return [*torchrun, str(JOBS / case.script), "--seconds", str(seconds), *which]


def read_run(case: Case, run: int, rec_path: Path, onset_path: Path, wall_s: float, condition: str) -> RunResult:
    """A recorded run scored: its report, its premise, and what the live view showed where the case asks.

    The live view is replayed for an onset case (how soon its cause showed) and for a healthy one (whether a
    warning ever showed); under a condition that takes CPUs a healthy case expects allocation (Case.under), and
    a warning is then its right answer, not a false alarm.
    """
    onset_s, before = time_to_finding(rec_path, onset_path, case.expected) if case.onset else (None, ())
    shown = live_alarms(rec_path) if case.expected == HEALTHY else ()
    result = result_of(case, run, gputop_report(rec_path), wall_s, condition)
    void = premise_missing(case, result.steps, onset_path, on_cpu=result.on_cpu)
    if condition == "quiet" and not void and not case.own_neighbour:
        void = neighbour_seen(rec_path)  # a quiet run is scored only where it was quiet
    return replace(result, onset_to_finding_s=onset_s, before_onset=before, shown_live=shown, void=void)


# A process outside the job that held this much of a core through a quiet run: the run measured the neighbour.
FOREIGN_CPU_PCT = 50.0


def neighbour_seen(rec_path: Path) -> str:
    """Why a quiet run was not quiet: a process outside the job (and outside gputop and the job's launcher) that
    the recording's host samples saw hold half a core or more while the ranks ran; "" when none did.

    A pass beside other work scores the allocation rule naming that work's pids, not the case (five of a
    published pass's misses were that), so such a run is void, with the pid, and the published figure comes
    from a pass with none."""
    store, t = recording.load(rec_path)
    snapshot = store.snapshot(t)
    ranks = snapshot.all_ranks()
    job = {r.hello.pid for r in ranks} | {r.hello.parent_pid for r in ranks if r.hello.parent_pid}
    samples = [h for h in snapshot.host_history if any(p.pid in job for p in h.processes)]
    for h in samples:
        for reading in h.processes:
            job.update(reading.child_pids)
    busy = [p for p in busy_others(samples, job) if p.cpu_pct >= FOREIGN_CPU_PCT]
    if not busy:
        return ""
    top = busy[0]
    return f"not quiet: pid {top.pid} ({top.command or top.name}) held {top.cpu_pct:.0f}% of a core beside the job"


def rescore(case: Case, folder: Path, run: int, condition: str) -> RunResult | None:
    """A kept run's recording reported again with the rules as they are now; None if it was not kept.

    The runs were recorded with the code of their day; only the reading of them
    is today's, so a rule change can be scored on the very runs that showed the
    need for it, and on all the others it might break.
    """
    rec_path = folder / f"{case.name}.{run}.jsonl"
    if not rec_path.exists():
        return None
    return read_run(case, run, rec_path, folder / f"{case.name}.{run}.onset", 0.0, condition)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT torchrun's session (it stops its ranks), then SIGKILL it."""
    for sig in (signal.SIGINT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
            return


def gputop_report(path: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "gputop", "report", str(path), "--format", "json"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def result_of(case: Case, run: int, report: dict[str, Any], wall_s: float, condition: str = "quiet") -> RunResult:
    findings = report["findings"]
    shown = [f for f in findings if f["severity"] in ("warn", "critical")]
    top = shown[0] if shown else None
    ranks = report["runs"][0]["ranks"] if report["runs"] else []
    own = next((f for f in findings if f["cause"] == case.expected), None)
    allocation_first = (
        condition != "quiet"
        and top is not None
        and top["cause"] == "allocation"
        and case.expected not in (HEALTHY, "allocation")
        and own is not None
    )
    # The finding whose ranks are scored: the top one, or under allocation first the case's own one below it.
    scored_finding = own if allocation_first else top
    return RunResult(
        allocation_first=allocation_first,
        case=case.name,
        expected=case.expected,
        run=run,
        top=top["cause"] if top else HEALTHY,
        top_title=top["title"] if top else "",
        findings=tuple(f"{f['severity']} {f['cause']}: {f['title']} {list(named_ranks(f))}" for f in findings),
        steps=tuple(int(r["steps"] or 0) for r in ranks),
        on_cpu=bool(ranks) and all(r.get("device") == "cpu" for r in ranks),
        wall_s=round(wall_s, 1),
        named=named_ranks(scored_finding) if scored_finding is not None else (),
        ranks_expected=case.ranks,
    )


def live_view(rec_path: Path) -> Iterator[tuple[float, list[Finding]]]:
    """The recording as the dashboard shows it live: each refresh's time and the findings it shows.

    Replayed every REFRESH_S through one persistent Diagnoser, as the dashboard
    diagnoses, so a finding shows only once it has held and not for a blip.
    """
    diagnoser = Diagnoser()
    for t, store in recording.refreshes(rec_path, REFRESH_S):
        yield t, diagnoser.update(summarize(store.snapshot(t, history=SNAPSHOT_HISTORY_WINDOWS)))


def warnings_in(findings: list[Finding]) -> set[str]:
    """The causes a refresh shows as warn or critical: what the panel flags."""
    return {f.cause for f in findings if f.severity != "info"}


def time_to_finding(rec_path: Path, onset_path: Path, cause: str) -> tuple[float | None, tuple[str, ...]]:
    """Seconds from the onset to the cause first showing live (warn or critical), None if it never did, and the
    causes shown before the onset (false alarms on the healthy part)."""
    try:
        onset_t = float(onset_path.read_text())
    except (OSError, ValueError):
        return None, ()
    before: set[str] = set()
    for t, findings in live_view(rec_path):
        if t < onset_t:
            before |= warnings_in(findings)
        elif cause in warnings_in(findings):
            return round(t - onset_t, 1), tuple(sorted(before))
    return None, tuple(sorted(before))


def live_alarms(rec_path: Path) -> tuple[str, ...]:
    """What a healthy run's live view showed at any refresh: each warn/critical cause, and "straggler (info)"
    for a straggler finding below warn, since even an info line that calls a healthy rank slow sends a
    newcomer looking for a fault that is not there."""
    shown: set[str] = set()
    for _, findings in live_view(rec_path):
        shown |= warnings_in(findings)
        shown |= {"straggler (info)" for f in findings if f.cause == "straggler" and f.severity == "info"}
    return tuple(sorted(shown))


# -- the tables ----------------------------------------------------------------------------


def summary(everything: list[RunResult]) -> dict[str, Any]:
    """Over the runs whose premise happened; the void ones are counted apart, with why."""
    results = [r for r in everything if not r.void]
    by_case: dict[str, list[RunResult]] = {}
    for r in results:
        by_case.setdefault(r.case, []).append(r)
    flipped = sorted(name for name, runs in by_case.items() if len({scored(r) for r in runs}) > 1)
    right = sum(r.right for r in results)
    allocation_first = sum(r.allocation_first for r in results if r.right)
    onsets = [r.onset_to_finding_s for r in results if r.onset_to_finding_s is not None]
    return {
        "runs": len(results),
        "right": right,
        "allocation_first": allocation_first,
        # Counted apart, not right: the right cause pinned on other ranks than the ones that have it.
        "ranks_wrong": [f"{r.case} run {r.run}: {ranks_slip_text(r)}" for r in results if r.ranks_wrong],
        # Not right either: a healthy run whose live view showed a warning, with what it showed.
        "shown_live": [f"{r.case} run {r.run}: {', '.join(r.shown_live)}" for r in results if r.shown_live],
        "cases": len(by_case),
        "flipped_cases": flipped,
        "flip_rate": round(len(flipped) / len(by_case), 3) if by_case else None,
        "onset_to_finding_s": onsets,
        "onset_missed": sum(1 for r in results if r.onset_to_finding_s is None and case_of(r.case).onset),
        "void": [f"{r.case} run {r.run}: {r.void}" for r in everything if r.void],
    }


def ranks_text(ranks: tuple[int, ...] | None) -> str:
    """ "[0, 1]", "[]" (no one rank), or "-" (not checked)."""
    return "-" if ranks is None else f"[{', '.join(map(str, ranks))}]"


def ranks_slip_text(result: RunResult) -> str:
    return f"{result.expected} named {ranks_text(result.named)}, the case's is {ranks_text(result.ranks_expected)}"


def case_of(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


def confusion_markdown(everything: list[RunResult]) -> str:
    results = [r for r in everything if not r.void]
    if not results:
        return "(no run scored: every run was void)"
    expected = list(dict.fromkeys(r.expected for r in results))
    columns = {scored(r) for r in results}
    found = expected + sorted(columns - set(expected) - set(APART)) + [c for c in APART if c in columns]
    counts = Counter((r.expected, scored(r)) for r in results)
    first = Counter(r.expected for r in results if r.allocation_first and r.right)
    lines = ["| expected \\ top finding | " + " | ".join(found) + " |", "|---" * (len(found) + 1) + "|"]
    for row in expected:
        cells = [str(counts[row, col]) if counts[row, col] else "." for col in found]
        if first[row]:  # counted right: allocation on top, this cause listed below it
            cells[found.index(row)] += f" ({first[row]} allocation first)"
        lines.append(f"| **{row}** | " + " | ".join(cells) + " |")
    if RANKS_WRONG in found:
        lines.append(f"\n*{RANKS_WRONG}*: the expected cause on top (or listed under allocation first), but "
                     "naming other ranks than the case's; not counted right.")  # fmt: skip
    if SHOWN_LIVE in found:
        lines.append(f"\n*{SHOWN_LIVE}*: a healthy run whose report is clean, but whose live view showed a "
                     "warning, or called a rank slow, at some refresh; not counted right.")  # fmt: skip
    return "\n".join(lines)


RANKS_WRONG = "right cause, wrong ranks"  # the confusion table's column for the ranks slip
SHOWN_LIVE = "healthy, warning shown live"  # its column for a healthy run whose live view alarmed
APART = (RANKS_WRONG, SHOWN_LIVE)  # columns of a wrong verdict that no cause names, last in the table


def scored(result: RunResult) -> str:
    """The column a run counts in: its expected cause when right (allocation first included), the ranks slip's
    own column when the cause is right but its ranks are not, the live alarm's when a healthy run's report is
    clean but its live view was not, else its top."""
    if result.ranks_wrong:
        return RANKS_WRONG
    if result.shown_live and result.top == HEALTHY:
        return SHOWN_LIVE
    return result.expected if result.right else result.top


def runs_markdown(results: list[RunResult]) -> str:
    lines = [
        "| case | expected [ranks] | run | top finding [ranks named] | steps (per rank) | wall s | onset→finding s |",
        "|---" * 7 + "|",
    ]
    for r in results:
        named = f" {ranks_text(r.named)}" if r.top_title and not r.allocation_first else ""
        title = r.error or (f"{r.top}{named}: {r.top_title}" if r.top_title else r.top)
        onset = (
            ""
            if not case_of(r.case).onset
            else ("missed" if r.onset_to_finding_s is None else f"{r.onset_to_finding_s:g}")
        )
        steps = "/".join(map(str, r.steps))
        title = title.replace("|", "/") + verdict_mark(r)
        expected = r.expected if r.ranks_expected is None else f"{r.expected} {ranks_text(r.ranks_expected)}"
        lines.append(f"| {r.case} | {expected} | {r.run} | {title} | {steps} | {r.wall_s:g} | {onset} |")
    return "\n".join(lines)


def summary_text(total: dict[str, Any]) -> str:
    """The lines under the confusion table: the runs not scored or not right and why, then the counts."""
    lines = []
    if total["void"]:
        lines.append(f"void (the case's premise did not happen, not scored): {'; '.join(total['void'])}")
    if total["ranks_wrong"]:
        lines.append(f"{RANKS_WRONG} (not counted right): {'; '.join(total['ranks_wrong'])}")
    if total["shown_live"]:
        lines.append(f"healthy runs with a warning shown live (not counted right): {'; '.join(total['shown_live'])}")
    lines.append(
        f"right (the cause, and the ranks it names): {total['right']}/{total['runs']} runs; "
        f"{RANKS_WRONG}: {len(total['ranks_wrong'])}; healthy runs with a warning shown live: "
        f"{len(total['shown_live'])}; flip rate: {len(total['flipped_cases'])}/{total['cases']} "
        f"cases ({', '.join(total['flipped_cases']) or 'none'}); onset to finding: {total['onset_to_finding_s']} s"
        f"{'; missed ' + str(total['onset_missed']) if total['onset_missed'] else ''}"
    )
    return "\n".join(lines)


def verdict_mark(r: RunResult) -> str:
    """What follows a run's top finding in the runs table: void, right, or why not."""
    if r.void:
        return f" (void: {r.void})"
    if r.ranks_wrong:
        return f" ✗ ({RANKS_WRONG}: {ranks_slip_text(r)})"
    if r.shown_live:
        return f" ✗ (shown live: {', '.join(r.shown_live)})"
    if not r.right:
        return " ✗"
    # The ranks named go with the finding they were read from: the top one, or the case's own under it.
    return f" (allocation first, own cause listed: {r.expected} {ranks_text(r.named)})" * r.allocation_first


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each case (default 3)")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--seconds", type=float, default=14.0, help="training time of each run (default 14)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR", help="keep recordings and job logs here")
    parser.add_argument("--condition", choices=CONDITIONS, default="quiet", help="what shares the cores (see above)")
    parser.add_argument("--rescore", type=Path, default=None, metavar="DIR",
                        help="run no job: report the recordings a --keep DIR holds with today's rules")  # fmt: skip
    args = parser.parse_args()
    names = [n for n in args.cases.split(",") if n]
    unknown = sorted(set(names) - {c.name for c in CASES})
    if unknown or args.runs < 1:
        parser.error(f"unknown case(s): {', '.join(unknown)}" if unknown else "--runs must be at least 1")
    cases = [c for c in CASES if not names or c.name in names]
    started = datetime.datetime.now(datetime.timezone.utc)
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="gputop-accuracy-") as folder:
        work = Path(folder) if args.keep is None else args.keep
        work.mkdir(parents=True, exist_ok=True)
        for case in cases:
            for run in range(1, args.runs + 1):
                expecting = case.under(args.condition)
                if args.rescore is not None:
                    result = rescore(expecting, args.rescore, run, args.condition)
                    if result is None:
                        continue
                else:
                    result = run_job(expecting, args.seconds, work, run, args.condition)
                results.append(result)
                verdict = "void" if result.void else "ok" if result.right else "WRONG"
                verdict += " RANKS" if result.ranks_wrong else ""
                verdict += f", shown live: {', '.join(result.shown_live)}" if result.shown_live else ""
                print(f"{case.name} run {run}: {result.top} ({verdict}) {result.top_title or result.error}",
                      file=sys.stderr, flush=True)  # fmt: skip
    total = summary(results)
    machine = f"{platform.node()}: {os.cpu_count()} CPUs, {platform.platform()}, python {platform.python_version()}"
    load = os.getloadavg()
    print(f"\n{started:%Y-%m-%d %H:%M} UTC, {machine}; condition {args.condition}; load at the end {load[0]:.1f}")
    print(f"command: {' '.join(['.venv/bin/python', *sys.argv])}\n")
    print(confusion_markdown(results), "\n")
    print(summary_text(total), "\n")
    print(runs_markdown(results))
    if args.out is not None:
        payload = {"started_utc": started.isoformat(), "machine": machine, "command": sys.argv,
                   "condition": args.condition,
                   "seconds": args.seconds, "summary": total, "results": [asdict(r) for r in results]}  # fmt: skip
        args.out.write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
