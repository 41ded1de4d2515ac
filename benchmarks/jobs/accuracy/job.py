"""One job of the diagnosis-accuracy corpus, by name; run under torchrun (the runner does this).

    torchrun --nproc_per_node=2 benchmarks/jobs/accuracy/job.py --case healthy_convnet --seconds 15

The Lightning case has a script of its own (lightning_case.py): Lightning runs the loop.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from collective_cases import desync_barrier_meets_metric, desync_metric_size
from exchange_cases import (
    communication_embedding_table,
    communication_wide_mlp,
    healthy_compute_bound_mlp,
    model_config_find_unused,
    model_config_tiny_buckets,
    parallelism_forty_tiny_steps,
    parallelism_tiny_bag_of_words,
    parallelism_tiny_mlp,
)
from input_cases import (
    allocation_threads_oversubscribed,
    allocation_workers_cpu_transform,
    data_loading_onset,
    data_loading_sleepy_worker,
    data_loading_stream_main_process,
    straggler_extra_compute_rank1,
    straggler_short_run_rank1,
    straggler_slow_loader_rank1,
    straggler_slow_optimizer_rank1,
)
from stack_cases import (
    accelerate_loader_bound,
    compile_recompiling_padded_batches,
    fsdp2_all_gathers_unhidden,
    fsdp2_exposed_all_gather,
    fsdp2_healthy,
    fsdp2_straggler_metric_rank1,
    tp_group_critical_path,
)
from steady_cases import (
    healthy_accumulation_manual_marks,
    healthy_convnet,
    stall_checkpoint_rank0,
    stall_periodic_evaluation,
)
from twod_cases import twod_healthy, twod_straggler_metric_between_passes_rank1
from unseen_cases import (
    allocation_outside_cpu_hog,
    data_loading_tokenize_in_collate,
    desync_metric_dtype,
    hang_rank1_gloo_timeout,
    hang_rank1_lock,
    hang_rank1_lock_sigterm,
    healthy_mingpt_like,
    healthy_symmetric_accumulation,
    parallelism_mingpt_batch2,
    stall_checkpoint_every_10_rank0,
    stall_irregular,
    straggler_metric_after_step_rank1,
    straggler_rotating_uneven_lengths,
)

from gputop.demos.teardown import exit_without_teardown

CASES: dict[str, Callable[[float], None]] = {
    fn.__name__: fn
    for fn in (
        data_loading_sleepy_worker,
        data_loading_stream_main_process,
        data_loading_onset,
        communication_wide_mlp,
        communication_embedding_table,
        straggler_slow_loader_rank1,
        straggler_extra_compute_rank1,
        straggler_slow_optimizer_rank1,
        parallelism_tiny_mlp,
        parallelism_tiny_bag_of_words,
        allocation_threads_oversubscribed,
        allocation_workers_cpu_transform,
        stall_checkpoint_rank0,
        stall_periodic_evaluation,
        model_config_find_unused,
        model_config_tiny_buckets,
        healthy_convnet,
        healthy_accumulation_manual_marks,
        hang_rank1_lock,
        straggler_metric_after_step_rank1,
        allocation_outside_cpu_hog,
        stall_checkpoint_every_10_rank0,
        stall_irregular,
        healthy_symmetric_accumulation,
        healthy_mingpt_like,
        data_loading_tokenize_in_collate,
        straggler_rotating_uneven_lengths,
        # Stacks beyond DDP, added for issue #34 before any rule was tuned to them.
        fsdp2_healthy,
        fsdp2_straggler_metric_rank1,
        fsdp2_exposed_all_gather,
        tp_group_critical_path,
        accelerate_loader_bound,
        compile_recompiling_padded_batches,
        # Issue #35's tiny batch, added before the rule that names it was written.
        parallelism_mingpt_batch2,
        # Issue #55's: how a hang's run ends, and a desync the backend goes on through.
        hang_rank1_lock_sigterm,
        hang_rank1_gloo_timeout,
        desync_metric_dtype,
        # Issue #46's: the work each step does, scored before any rule read it.
        fsdp2_all_gathers_unhidden,
        healthy_compute_bound_mlp,
        # Issue #56's: a 2-D job built like pytorch/examples', a short run with a strong straggler.
        twod_healthy,
        twod_straggler_metric_between_passes_rank1,
        straggler_short_run_rank1,
        parallelism_forty_tiny_steps,
        # Issue #55's desyncs gloo does not go on through: another size, a barrier against an all-reduce.
        desync_metric_size,
        desync_barrier_meets_metric,
    )
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=sorted(CASES), required=True)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    CASES[args.case](args.seconds)


if __name__ == "__main__":
    main()
    # gloo aborts now and then while the interpreter finalizes ("terminate called without an active
    # exception"), gputop or not: the exit handlers run (gputop's last window among them), then the process
    # leaves without finalizing, as tests/support/jobs/ddp_job.py and the demo do (gputop/demos/teardown.py).
    exit_without_teardown()
