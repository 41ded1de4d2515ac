"""Each cause's own details on its finding: what one rule knows that the title words and others read.

A finding's common parts (its ranks, the ranks that wait, their stack samples,
its host) are ``Finding``'s fields.  What only one cause has, a straggler's
slow phase or a stall's period, is one small frozen dataclass per cause, in
``Finding.details``: the engine, the exporter and the automatic capture read
these by name and type, not by a string key.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputop.diagnose.wording import ranks_short
from gputop.model.collectives import CollectiveFigures, HangCollective, size_text
from gputop.model.slowest import SlowestRanks


@dataclass(frozen=True)
class WaitedIn:
    """The collective where the others wait for the slow rank, and how much longer than it they wait there."""

    collective: CollectiveFigures  # the waiting ranks' typical figures for it, a step
    extra_s: float  # the waiting ranks' exposed time in it a step, less the slow rank's (the median over them)
    culprit: int
    victims: tuple[int, ...]

    def text(self) -> str:
        """'in all_gather on dp above all (21.3 ms a step more than rank 1)'."""
        return f"in {self.collective.name} above all ({1e3 * self.extra_s:.1f} ms a step more than rank {self.culprit})"

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.collective.kind,
            "group": self.collective.group,
            "extra_ms": round(1e3 * self.extra_s, 3),
            "culprit": self.culprit,
            "victims": list(self.victims),
        }


@dataclass(frozen=True)
class StragglerDetails:
    """Where the slow rank's time goes, or that no one rank is the slowest (rules.straggler, rules.rotating)."""

    # The slow rank's phase that holds its extra time: "loader", "forward", "backward", "own" (spread over its
    # phases), "other" (outside them) or a declared phase of its own ("optimizer"); None for a rotation.
    phase: str | None = None
    # A different rank is the slowest from step to step: the finding blames no one rank (it names none).
    rotating: bool = False
    # Step by step, how often each rank was the one the others waited for (gputop.model.slowest).
    slowest: SlowestRanks | None = None
    # The collective the others wait for it in, where the collectives say (FSDP2, TP).
    waited_in: WaitedIn | None = None
    # Every rank of one host is slow: one slow node, whose fix is the node's (rules.hosts).
    slow_node: bool = False


@dataclass(frozen=True)
class StallDetails:
    """What the stopping rank's stalls were spent on, and how often they come (rules.stall)."""

    in_loader: bool  # most of the stalls' time went to waiting for data
    period_steps: int | None  # one stall every N steps, when regular: an automatic capture spans one period


@dataclass(frozen=True)
class HangDetails:
    """Which of a hang's ranks were busy and which went silent (rules.hang)."""

    since_step: int  # the step count the first stuck rank stopped at
    busy_ranks: tuple[int, ...]  # stuck ranks still busy on the CPU since their last step
    lost_ranks: tuple[int, ...]  # ranks that stopped reporting meanwhile
    # Which numbered collective the stuck ranks are in and who never issued it, where their reporters say.
    collective: HangCollective | None = None


@dataclass(frozen=True)
class DesyncSide:
    """The ranks that issued collective #N as one call: its kind, size and the call site most of them are at."""

    ranks: tuple[int, ...]
    kind: str
    bytes: int | None  # None: not measured (DDP's all-reduce), or a kind whose size may differ
    site: str  # "`main` (train.py:190)"; "" without a frame of the user's code
    dtype: str = ""  # "float32", where the call's digest said (""; not known)

    def call_text(self) -> str:
        """ "all_reduce of 8 B int32"."""
        size = "" if self.bytes is None else f" of {size_text(self.bytes)}"
        return f"{self.kind}{size}" + (f" {self.dtype}" if self.dtype else "")

    def text(self) -> str:
        """ "rank 1 all_reduce of 8 B int32 from `main` (train.py:192)"."""
        return f"{ranks_short(self.ranks, 2)} {self.call_text()}" + (f" from {self.site}" if self.site else "")


@dataclass(frozen=True)
class DesyncDetails:
    """Which collective differs, and each side of it (rules.desync)."""

    group: str
    number: int
    sides: tuple[DesyncSide, ...]  # most ranks first


@dataclass(frozen=True)
class CommunicationDetails:
    """How much of the exchange was hidden, the NVLink traffic, and the collectives that hold the ranks up."""

    hidden_frac: float | None  # of the exchange's time, the share overlapped with compute
    nvlink_bytes_s: float | None  # the ranks' GPUs' NVLink traffic, both ways, mean per GPU
    collectives: tuple[str, ...]  # the holding collectives' names, most exposed first


@dataclass(frozen=True)
class RecompileDetails:
    """The function torch.compile compiled again, dynamo's reason, and what the recompiles cost."""

    function: str | None
    reason: str | None
    recompiles: int
    recompile_s_each: float


@dataclass(frozen=True)
class ParallelismDetails:
    """Which signs of too little work per step fired: they decide what the finding takes in as its symptoms."""

    # Tiny steps at a small batch (sign 3) or an exchange that more work per step would hide (sign 4): the
    # run's communication findings are symptoms of the step's size.
    tiny_steps: bool
    # Sign 4 alone: the steps are not tiny in themselves, so a straggler's finding stays its own.
    exchange_symptom: bool


@dataclass(frozen=True)
class AllocationDetails:
    """An allocation finding that measured the ranks waiting for a CPU (rules.cpu_contention)."""

    cpu_contention: bool  # it explains the symptoms a CPU shortage makes (its row in symptoms.EXPLAINS)


@dataclass(frozen=True)
class DataParallelDetails:
    """A model_config finding of ``nn.DataParallel`` (rules.data_parallel), not of the precision or DDP settings."""

    first_gpu: int  # the GPU that scatters and gathers for the others (its index)


Details = (
    DesyncDetails
    | StragglerDetails
    | StallDetails
    | HangDetails
    | CommunicationDetails
    | RecompileDetails
    | ParallelismDetails
    | AllocationDetails
    | DataParallelDetails
)
