"""torch.compile: the frames dynamo compiled in a window, how many were recompiles, how long they took, graph breaks.

Read from what dynamo records about itself on every compile, with no logging
or tracing turned on: ``torch._dynamo.utils._compilation_metrics`` (a bounded
deque, one ``CompilationMetrics`` per compile of a frame's forward and one per
backward, with the function, its duration and, for a recompile, the guard that
failed) and ``torch._dynamo.utils.counters["graph_break"]`` (graph breaks by
reason).  Both are private: a name missing in another torch leaves its fields
N/A.  The probe never imports dynamo: until the training script has (by calling
``torch.compile``), ``sys.modules`` has no ``torch._dynamo.utils`` and the
fields stay N/A.

Each compile of a function is named once in an event ("compile" for a first
compile, "recompile" with dynamo's reason), a few per run: the recompile
finding quotes them (docs/diagnosis.md#recompile).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from gputop.reporter.clock import StepMark

# Events naming a compiled function and why it was compiled again, per run: the first few say it all.
NOTES_PER_RUN = 6
REASON_CHARS = 200  # dynamo's reason, shortened: the first guard that failed, one line


class CompileProbe:
    """Dynamo's own record of its compiles, read as the entries it appended since the last window."""

    name = "compile"
    not_measured: str | None = None

    def __init__(self) -> None:
        # The entries read last time, held so their ids stay theirs; at first those compiled before the reporter.
        utils = sys.modules.get("torch._dynamo.utils")
        self._seen: list[Any] = list(getattr(utils, "_compilation_metrics", None) or ())
        self._notes: list[tuple[str, str]] = []  # (event kind, message), taken by the reporter thread
        self._notes_made = 0

    def read(self, marks: list[StepMark]) -> dict[str, Any]:
        utils = sys.modules.get("torch._dynamo.utils")
        if utils is None:
            return {}  # torch.compile never called: nothing compiled, nothing to say
        out: dict[str, Any] = {}
        breaks = graph_breaks(getattr(utils, "counters", None))
        if breaks is not None:
            out["graph_breaks"] = breaks
        entries = getattr(utils, "_compilation_metrics", None)
        if entries is None:
            self.not_measured = "compiles: this torch keeps no compilation metrics (torch._dynamo.utils)"
            return out
        now = list(entries)  # one C call: dynamo appends on the training thread meanwhile
        seen = {id(e) for e in self._seen}
        self._seen = now
        compiles = recompiles = 0
        compile_s = 0.0
        for entry in now:
            if id(entry) in seen or getattr(entry, "is_runtime", False):
                continue
            compile_s += entry_seconds(entry)
            if getattr(entry, "co_name", None) is None:
                continue  # a backward's compile: its time counts, the frame was counted with its forward
            compiles += 1
            reason = getattr(entry, "recompile_reason", None)
            if reason is not None or frame_compile_number(getattr(entry, "compile_id", None)):
                recompiles += 1
                self._note("recompile", f"recompiled {where(entry)}: {one_line(reason or 'no reason recorded')}")
            else:
                self._note("compile", f"compiled {where(entry)}")
        out.update(compiles=compiles, recompiles=recompiles, compile_s=compile_s)
        return out

    def take_notes(self) -> list[tuple[str, str]]:
        """The events to send, as (kind, message); each is taken once (reporter thread)."""
        notes, self._notes = self._notes, []
        return notes

    def _note(self, kind: str, message: str) -> None:
        if self._notes_made < NOTES_PER_RUN:
            self._notes_made += 1
            self._notes.append((kind, message))


def graph_breaks(counters: Any) -> int | None:
    """Graph breaks so far, over every reason; None where dynamo keeps no such counter."""
    if not hasattr(counters, "get"):
        return None
    by_reason = counters.get("graph_break")  # .get: the defaultdict gains no key for our asking
    if by_reason is None:
        return 0
    try:
        return int(sum(by_reason.values()))
    except RuntimeError:  # dynamo added a reason while we summed: the next window reads it
        return None


def entry_seconds(entry: Any) -> float:
    """How long one compile took: its whole duration, else the forward's or backward's compile time."""
    duration_us = getattr(entry, "duration_us", None)
    if duration_us is not None:
        return float(duration_us) / 1e6
    seconds = getattr(entry, "entire_frame_compile_time_s", None)
    if seconds is not None:
        return float(seconds)
    backward_us = getattr(entry, "backward_cumulative_compile_time_us", None)
    return float(backward_us) / 1e6 if backward_us is not None else 0.0


def frame_compile_number(compile_id: Any) -> int:
    """Which compile of its frame an entry is: 0 for the first ("3/0"), 2 for the third ("3/2", "!1/3/2_1")."""
    text = str(compile_id or "")
    try:
        return int(text.rpartition("/")[2].partition("_")[0])
    except ValueError:
        return 0


def where(entry: Any) -> str:
    """ "'forward' (train.py:88)": the compiled function, with its file's name and line."""
    filename = getattr(entry, "co_filename", None) or "?"
    line = getattr(entry, "co_firstlineno", None)
    return f"'{entry.co_name}' ({os.path.basename(filename)}{'' if line is None else f':{line}'})"


def one_line(reason: str) -> str:
    first = reason.strip().splitlines()[0] if reason.strip() else reason
    return first[:REASON_CHARS]
