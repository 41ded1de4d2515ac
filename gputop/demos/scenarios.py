"""The demo scenarios: what each one reproduces and the knobs that make it.

Kept apart from ``train.py`` so the CLI can list them without importing torch.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    """The knobs that make a run show one cause."""

    about: str
    model: str = "mlp"  # mlp: Linear layers of width hidden; cnn: a small CIFAR-sized convnet
    hidden: int = 256
    layers: int = 4
    batch_size: int = 8192
    batch_delay_s: float = 0.0  # per batch, in the dataset: a slow decode or disk
    slow_rank: int | None = None  # only this rank's dataset is slow
    torch_threads: int = 1  # per rank
    num_workers: int = 0
    bucket_cap_mb: float = 25.0  # DDP's default; small buckets let all-reduce overlap backward
    needs_gpu: bool = False
    oversubscribe: float = 0.0  # > 0: compute threads over all ranks = this x the cores (at least torch_threads)
    # > 0: after each step one rank, drawn at random (the same draw on every rank), works this long more
    rotating_extra_s: float = 0.0


SCENARIOS: dict[str, Scenario] = {
    "healthy": Scenario(
        "compute dominates each step; input keeps up and gradient exchange overlaps backward",
        # Convolutions: much compute for few weights, so the all-reduce is small
        # next to backward even when two ranks and gloo's threads share 2 cores.
        # The MLP at batch 8192 sat at 5-14% exposed comm, across the 10% line.
        model="cnn",
        batch_size=64,
        bucket_cap_mb=0.25,
    ),
    "slow_loader": Scenario(
        "every rank waits for input: each batch takes 60 ms to load in the main process",
        batch_delay_s=0.06,
    ),
    "straggler": Scenario(
        "rank 1's input is slow, so rank 0 waits for it in every all-reduce",
        batch_delay_s=0.06,
        slow_rank=1,
    ),
    "rotating": Scenario(
        "each step a rank drawn at random works 80 ms more (a metric, the longest batch): the others wait "
        "for a different rank each time",
        # Short steps of their own (~20 ms), so that the extra work stands far out of their jitter and a short
        # run still holds the 20 steps a pattern needs.
        batch_size=2048,
        rotating_extra_s=0.08,
    ),
    "comm_bound": Scenario(
        "a wide model with a tiny batch: gradient exchange dwarfs compute",
        hidden=2048,
        layers=4,
        batch_size=8,
    ),
    "small_batch": Scenario(
        "a tiny model and batch: each step is mostly Python and launch overhead",
        hidden=32,
        layers=2,
        batch_size=2,
    ),
    "oversubscribed": Scenario(
        "the ranks run twice as many compute threads as the machine has cores",
        torch_threads=4,  # the least, for 2 ranks on 2 cores: what the scenario was measured with
        oversubscribe=2.0,
    ),
    "memory_pressure": Scenario(
        "activations fill the GPU: the caching allocator retries and frees",
        hidden=8192,
        layers=8,
        batch_size=4096,
        needs_gpu=True,
    ),
}

SCENARIO_NAMES = tuple(SCENARIOS)


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity, as taskset, cgroups' cpusets and Slurm set it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def fitted(scenario: Scenario, *, cores: int, nproc: int) -> Scenario:
    """The scenario sized to this machine, so that it shows its own cause on any core count.

    Every scenario but ``oversubscribed`` keeps one compute thread a rank: on 2
    cores that leaves gloo's threads, the DataLoader and the dashboard room,
    and on more cores the ranks have even more (the healthy run is measured
    healthy at 1 thread a rank on 2 cores).  ``oversubscribed`` scales its
    threads with the cores, or a 32-core machine would run 8 threads on 32
    cores and show nothing wrong.
    """
    if scenario.oversubscribe <= 0:
        return scenario
    wanted = -(-round(scenario.oversubscribe * cores) // max(nproc, 1))  # ceil
    return dataclasses.replace(scenario, torch_threads=max(scenario.torch_threads, wanted))


def plan(name: str, *, cores: int, nproc: int) -> str:
    """One line for the user: what the demo runs on this machine, and what shares its cores."""
    scenario = fitted(SCENARIOS[name], cores=cores, nproc=nproc)
    threads = scenario.torch_threads
    text = (
        f"demo {name!r}: {nproc} rank{'s' if nproc != 1 else ''} x {threads} compute "
        f"thread{'s' if threads != 1 else ''} on {cores} CPU{'s' if cores != 1 else ''}"
    )
    if name != "oversubscribed" and nproc * threads > cores:
        return text + ": more compute threads than CPUs, so the ranks wait for one and gputop will say so first"
    if name != "oversubscribed" and nproc * threads + 1 > cores:
        return text + ", shared with gloo's threads and gputop"
    return text
