"""What every check is: a named line with a status, a summary and, when not ok, the fix."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["ok", "note", "problem"]

MARKS: dict[Status, str] = {"ok": "ok", "note": "--", "problem": "!!"}

NAME_WIDTH = 12  # the longest check name, "driver calls", lines the summaries up

MiB = 1 << 20

NVML, DRIVER_CALLS, GPUS, CONTAINER, TORCH = "nvml", "driver calls", "gpus", "container", "torch"

SOCKET, COLLECTOR, TOKEN, TLS, DISABLE = "socket", "collector", "token", "tls", "disable"

SETTINGS = "settings"


@dataclass(frozen=True)
class Check:
    """One line of the doctor's answer: what was found, and for anything not ok, what to do."""

    name: str
    status: Status
    summary: str
    fix: str = ""
    details: tuple[str, ...] = ()  # further lines: one per GPU, one per missing call
    facts: dict[str, Any] = field(default_factory=dict)  # the same findings as data, for --format json


def guarded(name: str, check: Callable[[], Check]) -> Check:
    """The check's answer, or a line saying it broke: one broken check must not hide the others."""
    try:
        return check()
    except Exception as exc:
        return Check(
            name,
            "problem",
            f"this check failed: {type(exc).__name__}: {exc}",
            fix="a bug in gputop doctor: please report it with this output",
        )


def render_text(check: Check) -> list[str]:
    indent = " " * (len("ok  ") + NAME_WIDTH + 2)
    line = f"{MARKS[check.status]}  {check.name:<{NAME_WIDTH}}  {check.summary}"
    if check.fix:
        line += f"; {check.fix}"
    return [line, *(indent + detail for detail in check.details)]


def as_json(check: Check) -> dict[str, Any]:
    return {**asdict(check), "mark": MARKS[check.status], "details": list(check.details)}
