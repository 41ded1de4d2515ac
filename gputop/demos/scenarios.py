"""The demo scenarios: what each one reproduces and the knobs that make it.

Kept apart from ``train.py`` so the CLI can list them without importing torch.
"""

from __future__ import annotations

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
        "each rank runs 4 compute threads on a machine with fewer cores than ranks x threads",
        torch_threads=4,
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
