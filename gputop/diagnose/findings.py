"""What a diagnosis says: one finding per cause at work, with its evidence and a fix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

if TYPE_CHECKING:
    from gputop.diagnose.autocapture import FindingCapture
    from gputop.diagnose.waste import Waste

Cause = Literal[
    "parallelism",
    "data_loading",
    "model_config",
    "memory",
    "communication",
    "straggler",
    "allocation",
    "recompile",
    "stall",
    "hang",
    "unobserved",
]
Severity = Literal["info", "warn", "critical"]
CAUSES: tuple[Cause, ...] = get_args(Cause)
SEVERITIES: tuple[Severity, ...] = get_args(Severity)  # worst last, so SEVERITIES.index() orders them


FindingKey = tuple[str | None, Cause, tuple[int, ...], tuple[int, ...]]


@dataclass(frozen=True)
class Evidence:
    """One number that fired a rule, and the threshold it crossed."""

    metric: str  # "loader_wait_pct"
    value: float
    threshold: float
    unit: str = ""  # "%", "ms", "GiB"
    op: str = ">"  # how value compared with threshold
    rank: int | None = None
    gpu: int | None = None
    spread: float | None = None  # the value's band half-width (2 standard errors), same unit

    def __str__(self) -> str:
        where = f"rank {self.rank} " if self.rank is not None else (f"GPU {self.gpu} " if self.gpu is not None else "")
        band = f" ± {self.spread:.2g}" if self.spread is not None else ""
        return f"{where}{self.metric} {self.value:.3g}{band}{self.unit} {self.op} {self.threshold:.3g}{self.unit}"


@dataclass(frozen=True)
class Finding:
    """A cause of low GPU utilization at work, where, why we think so, what to change."""

    cause: Cause
    severity: Severity
    title: str  # one line: "rank 3 waits for data 41% of each step"
    suggestion: str  # concrete: "DataLoader(num_workers=4, pin_memory=True, persistent_workers=True)"
    evidence: tuple[Evidence, ...] = ()
    ranks: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    run_id: str | None = None
    doc: str = ""  # "docs/diagnosis.md#data_loading"
    extra: dict[str, Any] = field(default_factory=dict)
    # For ordering findings of one severity: the share of step time at stake
    # (0..1) where the rule measures one, else how far past its threshold.
    magnitude: float = 0.0
    # What fixing it is worth: the step time it costs each step, estimated from
    # the measured phases with the culprit removed, and the step it is part of.
    cost_s: float | None = None
    step_s: float | None = None
    # What that share of the run's GPUs (cores on a CPU run) comes to in device-hours (gputop.diagnose.waste).
    waste: Waste | None = None
    # The culprit rank's profile, taken when the finding had held for its alert time (gputop.diagnose.autocapture).
    capture: FindingCapture | None = None

    @property
    def speedup(self) -> float | None:
        """Steps per second after the fix over now, if the cost went away and nothing else changed."""
        if self.cost_s is None or not self.step_s or self.cost_s >= self.step_s:
            return None
        return self.step_s / (self.step_s - self.cost_s)

    @property
    def stake(self) -> float:
        """The share of step time at stake: the cost estimate where there is one, else the magnitude."""
        if self.cost_s is not None and self.step_s:
            return min(self.cost_s / self.step_s, 1.0)
        return self.magnitude

    @property
    def worth_text(self) -> str | None:
        """'fixing it: about 58 ms a step, 2.4x steps/s; wastes about 0.7 GPU-hours an hour (1.9 so far)'."""
        return self.worth()

    def worth(self, price_per_hour: float | None = None) -> str | None:
        """What fixing it is worth, with the waste priced at ``price_per_hour`` a device-hour when given."""
        speedup = self.speedup
        if speedup is None or self.cost_s is None:
            return None
        text = f"fixing it: about {self.cost_s * 1e3:.3g} ms a step, {speedup:.2g}x steps/s"
        if self.waste is not None:
            text += f"; {self.waste.text(price_per_hour)}"
        return text

    @property
    def key(self) -> FindingKey:
        """What makes two findings from successive snapshots "the same" one."""
        return (self.run_id, self.cause, self.ranks, self.gpus)

    @property
    def severity_rank(self) -> int:
        return SEVERITIES.index(self.severity)

    def to_dict(self, price_per_hour: float | None = None) -> dict[str, Any]:
        """The finding as JSON: the report's and an alert command's; money where a price is given."""
        return {
            "cause": self.cause,
            "severity": self.severity,
            "title": self.title,
            "ranks": list(self.ranks),
            "gpus": list(self.gpus),
            "run_id": self.run_id,
            "evidence": [{k: v for k, v in vars(e).items() if v is not None} | {"text": str(e)} for e in self.evidence],
            "suggestion": self.suggestion,
            "doc": self.doc,
            "cost_ms_per_step": None if self.cost_s is None else round(self.cost_s * 1e3, 3),
            "speedup_x": None if self.speedup is None else round(self.speedup, 2),
            "worth": self.worth(price_per_hour),
            "waste": None if self.waste is None else self.waste.to_dict(price_per_hour),
            # Where the named ranks' training threads were (their stack samples), by rank: function, file, line.
            "frames": {str(rank): frames for rank, frames in self.extra.get("frames", {}).items()},
            # A straggler's step by step: how often each rank was the one the others waited for (gputop.model.slowest).
            "slowest": self.extra.get("slowest"),
            # Where the others wait for a straggler: the kind of collective on its group, how much longer than the
            # straggler they wait in it a step, the culprit and its victims (stacks whose collectives the tap times).
            "waited_in": self.extra.get("waited_in"),
            # The culprit rank's profile (top operators, trace, its stack samples meanwhile); None: not taken.
            "capture": None if self.capture is None else self.capture.to_dict(),
        }
