"""What a diagnosis says: one finding per cause at work, with its evidence, a fix, what it wastes and its profile."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

from gputop.diagnose.details import DataParallelDetails, Details, StragglerDetails
from gputop.diagnose.wording import hours_text
from gputop.model.captures import compare
from gputop.model.frames import RankFrames
from gputop.protocol import CaptureResult, OpTime

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
    "desync",
    "unobserved",
]
Severity = Literal["info", "warn", "critical"]
CAUSES: tuple[Cause, ...] = get_args(Cause)
SEVERITIES: tuple[Severity, ...] = get_args(Severity)  # worst last, so SEVERITIES.index() orders them


FindingKey = tuple[str | None, Cause, tuple[int, ...], tuple[int, ...]]

DOC_PATH = "docs/diagnosis.md"

TOP_OPS_SHOWN = 3  # operators a capture's one line names


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


Unit = Literal["GPU", "core"]


@dataclass(frozen=True)
class Waste:
    """Device-hours a finding's cause idles: per hour of the run, and over the run so far."""

    unit: Unit
    devices: float  # what the run holds: GPUs, or busy cores
    per_hour: float  # device-hours per hour
    so_far: float  # device-hours over the run so far
    # The energy that share of the run's GPUs draws, from NVML's power readings: kWh every hour; None
    # on a CPU run or where no GPU of the run reports its power.
    kwh_per_hour: float | None = None
    kwh_so_far: float | None = None

    def text(self, price_per_hour: float | None = None) -> str:
        """ "wastes about 0.74 GPU-hours an hour (1.9 so far; 1.85 an hour at 2.50 per GPU-hour)".

        ``price_per_hour`` is a GPU-hour's price (``--gpu-hour-price``): a CPU run's core-hours are not priced.
        """
        price_per_hour = price_per_hour if self.unit == "GPU" else None
        unit = f"{self.unit}-hours"
        out = f"wastes about {hours_text(self.per_hour)} {unit} an hour ({hours_text(self.so_far)} so far"
        if price_per_hour is not None:
            out += f"; {price_per_hour * self.per_hour:,.2f} an hour at {price_per_hour:,.2f} per {self.unit}-hour"
        if self.kwh_per_hour is not None:
            out += f"; {hours_text(self.kwh_per_hour)} kWh an hour"
        return out + ")"

    def to_dict(self, price_per_hour: float | None = None) -> dict[str, Any]:
        price_per_hour = price_per_hour if self.unit == "GPU" else None
        out: dict[str, Any] = {
            "unit": self.unit,
            "devices": round(self.devices, 2),
            "per_hour": round(self.per_hour, 3),
            "so_far": round(self.so_far, 3),
        }
        if self.kwh_per_hour is not None and self.kwh_so_far is not None:
            out["kwh_per_hour"] = round(self.kwh_per_hour, 3)
            out["kwh_so_far"] = round(self.kwh_so_far, 4)
        if price_per_hour is not None:
            out["price_per_hour"] = price_per_hour
            out["money_per_hour"] = round(price_per_hour * self.per_hour, 2)
            out["money_so_far"] = round(price_per_hour * self.so_far, 2)
        return out


@dataclass(frozen=True)
class FindingCapture:
    """A capture as its finding carries it: the rank's top operators, its trace, where its thread was."""

    rank: int
    id: str
    t: float  # when the rank answered (unix time)
    ok: bool
    steps: int = 0
    wall_s: float = 0.0
    trace_path: str = ""
    top_ops: tuple[OpTime, ...] = ()
    error: str = ""  # why there is no capture (the rank's answer)
    frames: RankFrames | None = None  # its stack samples over the seconds the capture spans

    def ops_text(self, n: int = TOP_OPS_SHOWN) -> str:
        """ "aten::addmm 4.1 ms/step, c10d::allreduce_ 2.0 ms/step" (self time, CPU plus device)."""
        result = CaptureResult(run_id="-", rank=self.rank, id=self.id, t=self.t, ok=self.ok, steps=self.steps,
                               top_ops=self.top_ops)  # fmt: skip
        _, rows = compare([result], n)
        parts = []
        for row in rows:
            cells = [c for c in row[1:] if c != "N/A"]
            parts.append(f"{row[0]} {' + '.join(cells)} ms/step")
        return ", ".join(parts)

    def text(self) -> str:
        """One line: what the capture found, or why there is none."""
        if not self.ok:
            return f"profile of rank {self.rank} failed: {self.error}"
        ops = self.ops_text() or "no operators"
        places = [] if self.frames is None else [place.text() for place in self.frames.top[:2]]
        where = f"; its thread {', '.join(places)}" if places else ""
        return f"profile of rank {self.rank}, {self.steps} steps: {ops}{where}; trace {self.trace_path}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "id": self.id,
            "t": self.t,
            "ok": self.ok,
            "steps": self.steps,
            "wall_s": round(self.wall_s, 4),
            "trace_path": self.trace_path,
            "top_ops": [
                {"name": op.name, "calls": op.calls, "self_cpu_s": op.self_cpu_s, "self_device_s": op.self_device_s}
                for op in self.top_ops
            ],
            "error": self.error,
            "frames": None if self.frames is None else self.frames.to_dict(),
            "text": self.text(),
        }


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
    # The host of the ranks it names in a multi-host run (rules.hosts), or of the CPUs or GPUs it is about;
    # the exporter's Hostname label.
    hostname: str | None = None
    # The ranks that wait for the ones it names: a straggler's peers, a stall's or a hang's ranks held up by it.
    waiting_ranks: tuple[int, ...] = ()
    # Where the named ranks' training threads were (their stack samples), one per rank.
    frames: tuple[RankFrames, ...] = ()
    # The causes whose findings it explains, where the finding itself says so (gputop.diagnose.symptoms takes
    # them in): a DDP setting's communication, or every rank's slow input its slow-input stragglers.
    explains: tuple[Cause, ...] = ()
    # What only its cause has: a straggler's phase, a stall's period, ... (gputop.diagnose.details).
    details: Details | None = None
    # For ordering findings of one severity: the share of step time at stake
    # (0..1) where the rule measures one, else how far past its threshold.
    magnitude: float = 0.0
    # What fixing it is worth: the step time it costs each step, estimated from
    # the measured phases with the culprit removed, and the step it is part of.
    cost_s: float | None = None
    step_s: float | None = None
    # What that share of the run's GPUs (cores on a CPU run) comes to in device-hours (waste.with_waste).
    waste: Waste | None = None
    # The culprit rank's profile, taken when the finding had held for its alert time (gputop.diagnose.autocapture).
    capture: FindingCapture | None = None

    @property
    def doc(self) -> str:
        """Where docs/diagnosis.md explains it: its cause's section, or its rule's where one rule has its own."""
        return doc_anchor("data_parallel" if isinstance(self.details, DataParallelDetails) else self.cause)

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
        text = f"fixing it: about {about_time(self.cost_s)} a step, {speedup:.2g}x steps/s"
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
        straggler = self.details if isinstance(self.details, StragglerDetails) else None
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
            "frames": {str(frames.rank): frames.to_dict() for frames in self.frames},
            # A straggler's step by step: how often each rank was the one the others waited for (gputop.model.slowest).
            "slowest": None if straggler is None or straggler.slowest is None else straggler.slowest.to_dict(),
            # Where the others wait for a straggler: the kind of collective on its group, how much longer than the
            # straggler they wait in it a step, the culprit and its victims (stacks whose collectives the tap times).
            "waited_in": None if straggler is None or straggler.waited_in is None else straggler.waited_in.to_dict(),
            # The culprit rank's profile (top operators, trace, its stack samples meanwhile); None: not taken.
            "capture": None if self.capture is None else self.capture.to_dict(),
        }


def doc_anchor(section: str) -> str:
    """The section of docs/diagnosis.md named ``section``: a cause's ("data_loading"), or one rule's."""
    return f"{DOC_PATH}#{section}"


def about_time(seconds: float) -> str:
    """ "58 ms", "1.21 s", "1,250 s": three figures at most, never an exponent (a 2-D job's step read "about
    1.21e+03 ms a step", issue #56)."""
    if seconds < 0.9995:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 999.5:
        return f"{seconds:.3g} s"
    return f"{seconds:,.0f} s"
