"""A window with every field filled: what merging and the window history must keep, field by field."""

from __future__ import annotations

from gputop.protocol import CollectiveTimes, Window


def full_window(seq: int) -> Window:
    """A window with every field a reporter can fill, filled."""
    return Window(
        run_id="r", rank=0, seq=seq, t0=seq * 0.5, t1=seq * 0.5 + 0.5, steps=5, step_total=5 * seq, timed_steps=4,
        step_time_sum_s=0.5, step_time_p50_s=0.1, step_time_p95_s=0.1, step_time_max_s=0.2, step_sketch={700: 5},
        slow_steps=((0.2, 0.05),), step_hist={40: 5}, gpu_step_time_p50_s=0.08, loader_wait_s=0.05, loader_batches=5,
        optimizer_s=0.01, flops_sum=1e9, flops_time_s=0.4, flops_steps=4,
        samples=320, forwards=5, forward_s=0.02, backward_s=0.04, comm_s=0.03, overlap_s=0.02, ddp_iteration=5 * seq,
        ddp_steps=5, mem_allocated_bytes=1, mem_reserved_bytes=2, mem_peak_bytes=3, mem_total_bytes=4,
        alloc_retries=0, ooms=0, cpu_pct=90.0, rss_bytes=5, threads=6, workers=2, workers_cpu_pct=80.0,
        main_cpu_wait_s=0.01, cpu_wait_s=0.02, cpu_run_s=0.4, workers_cpu_wait_s=0.03, dropped=0, reporter_cpu_s=0.001,
        hook_s=0.0001, sent_bytes=900, phases_from="hooks", compiles=1, recompiles=1, compile_s=0.5, graph_breaks=2,
        collectives=(CollectiveTimes("all_gather", "dp", 4, 4096, 0.004, 0.001),),
    )  # fmt: skip
