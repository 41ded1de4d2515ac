"""Why a rank's figure is N/A, in words a user can act on: the reason one keypress away, never a made-up number."""

from __future__ import annotations

from gputop.model.figures import SPAN_S
from gputop.model.rank_stats import RankStats
from gputop.model.snapshot import RankSnapshot


def na_reasons(rank: RankSnapshot, stats: RankStats) -> dict[str, str]:
    """Why each N/A column of a rank is N/A, in words a user can act on."""
    hello = rank.hello
    on_cpu = (hello.device or "").startswith("cpu")
    reasons: dict[str, str] = {}
    if stats.step.p50_s is None:
        reasons["step"] = f"step time: no optimizer step in the last {SPAN_S:.0f} s"
    if stats.phases.loader_wait_frac is None:
        reasons["loader"] = "loader wait: loader not tracked (iterate it with gputop.track(loader))"
    if stats.step.samples_per_s is None:
        reasons["samples"] = "samples/s: batch size unknown (gputop.track(loader) reports it)"
    said = not_measured(rank)
    if stats.step.gpu_p50_s is None and not on_cpu and "gpu_step_times" in said:
        reasons["gpu_step"] = f"GPU step time: {said['gpu_step_times']}"
    if stats.phases.forward_s is None:
        if "ddp_stats" in said:
            why = f"DDP stats unavailable: {said['ddp_stats']}"
        elif "collectives" in said:
            why = f"forward, backward, comm: {said['collectives']}"
        elif hello.ddp is None:
            why = "forward, backward, comm: model not watched yet (gputop.watch(model))"
        elif hello.ddp is False and on_cpu:
            why = "forward, backward, comm: no training step timed by the model's hooks yet"
        elif hello.ddp is False:
            why = ("forward, backward, comm: without DDP's logger they need CUDA events on the streams, which gputop "
                   "does not record yet")  # fmt: skip
        else:
            why = "DDP stats unavailable: DDP has not logged a sampled iteration yet"
        reasons["ddp"] = why
    if stats.memory.allocated_bytes is None:
        reasons["mem"] = "memory: CPU run (only CUDA memory is measured)" if on_cpu else "memory: not reported"
    if stats.cpu.pct is None:
        reasons["cpu"] = "CPU%: not reported by the rank's reporter"
    if hello.device_uuid is None:
        reasons["gpu"] = "GPU: CPU run" if on_cpu else "GPU: the rank did not report a device UUID"
    return reasons


def not_measured(rank: RankSnapshot) -> dict[str, str]:
    """Each probe's latest word on why its figures are N/A (``not_measured`` events: "<probe>: <why>")."""
    said: dict[str, str] = {}
    for event in rank.events:
        if event.kind == "not_measured":
            probe, _, why = event.message.partition(": ")
            said[probe] = why
    return said
