"""What a diagnosis says: one finding per cause at work, with its evidence and a fix."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

Cause = Literal[
    "parallelism",
    "data_loading",
    "model_config",
    "memory",
    "communication",
    "straggler",
    "allocation",
    "stall",
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

    def __str__(self) -> str:
        where = f"rank {self.rank} " if self.rank is not None else (f"GPU {self.gpu} " if self.gpu is not None else "")
        return f"{where}{self.metric} {self.value:.3g}{self.unit} {self.op} {self.threshold:.3g}{self.unit}"


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

    @property
    def key(self) -> FindingKey:
        """What makes two findings from successive snapshots "the same" one."""
        return (self.run_id, self.cause, self.ranks, self.gpus)

    @property
    def severity_rank(self) -> int:
        return SEVERITIES.index(self.severity)

    def to_dict(self) -> dict[str, Any]:
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
        }
