"""The last collective this rank entered, from torch's Flight Recorder, when the user turned it on.

torch.distributed keeps a ring of the collectives each rank entered (its
"Flight Recorder") when ``TORCH_FR_BUFFER_SIZE`` (or, for NCCL,
``TORCH_NCCL_TRACE_BUFFER_SIZE``) is above 0: NCCL's process groups and, in
recent torch, gloo's.  In a hang it tells what the stacks cannot: which
collective each rank is in, by its sequence number, so "rank 0 entered
all_reduce #41, rank 1's last was #40" names the rank that never joined.

A dump serialises the whole ring (thousands of entries at the sizes users
set), so the reporter reads it only when the training thread has not
finished a step for ``STUCK_AFTER_S`` and then at most every ``READ_EVERY_S``.
Read on the reporter thread through torch's own dump function, which the
watchdog itself calls from its thread.  gputop never turns the recorder on.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

from gputop.protocol import Collective

STUCK_AFTER_S = 3.0  # no step for this long: read the recorder (the hang rule's floor is 5 s)
READ_EVERY_S = 5.0  # then at most this often while it lasts
ENV_NAMES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")  # the first set wins, as torch reads them


def enabled(environ: Mapping[str, str]) -> bool:
    """Whether the user turned the recorder on (a buffer of at least one entry)."""
    for name in ENV_NAMES:
        if name in environ:
            try:
                return int(environ[name]) > 0
            except ValueError:
                return False
    return False


# Said once, as a not_measured event, where the user turned the recorder on and this torch cannot dump it.
NO_DUMP = (
    "the Flight Recorder is on but this torch cannot dump it (_dump_fr_trace_json, torch 2.8+; "
    "_dump_nccl_trace_json, 2.5+ with NCCL): a hang is named without the collective each rank entered"
)


def dump_function() -> Callable[[], bytes] | None:
    """torch's JSON dump of the recorder (named for NCCL in older torch), or None where this torch has none."""
    try:
        from torch._C import _distributed_c10d as c10d
    except ImportError:
        return None
    for name in ("_dump_fr_trace_json", "_dump_nccl_trace_json"):
        dump = getattr(c10d, name, None)
        if dump is not None:
            return lambda dump=dump: dump(includeCollectives=True, onlyActive=False)  # type: ignore[misc]
    return None


def last_entered(trace: Mapping[str, Any]) -> Collective | None:
    """The collective entered last, from a dump: the newest entry that is not point-to-point."""
    entries = [e for e in trace.get("entries") or () if isinstance(e, dict) and not e.get("is_p2p")]
    if not entries:
        return None
    entry = max(entries, key=lambda e: (e.get("time_created_ns") or 0, e.get("record_id") or 0))
    group = entry.get("process_group")
    return Collective(
        name=str(entry.get("profiling_name") or "?")[:64],
        seq=max(int(entry.get("collective_seq_id") or 0), 0),
        state=str(entry.get("state") or "")[:16],
        group=str(group[1] if isinstance(group, list) and len(group) > 1 else group or "")[:64],
    )


class FlightRecorderReader:
    """Reads the last entered collective when the training thread is stuck; reporter thread only."""

    def __init__(self, dump: Callable[[], bytes]) -> None:
        self._dump = dump
        self._next_s = 0.0
        self.last: Collective | None = None  # the newest read, sent with the stacks while the rank is stuck

    def read_if_stuck(self, now_s: float, since_step_s: float | None) -> Collective | None:
        """The last entered collective while no step has finished for ``STUCK_AFTER_S`` (None: stepping, or none)."""
        if since_step_s is None or since_step_s < STUCK_AFTER_S:
            self.last, self._next_s = None, 0.0
            return None
        if now_s >= self._next_s:
            self._next_s = now_s + READ_EVERY_S
            self.last = last_entered(json.loads(self._dump()))
        return self.last


ISSUED = "issued"  # the state of a collective known by the process group's own count, not the recorder's entries


def issued_on_default_group(since_step_s: float | None) -> Collective | None:
    """Without the recorder: while no step has finished for ``STUCK_AFTER_S``, the default process group's own
    count of the collectives this rank has issued (issue #48).  torch numbers every collective of a group, those
    DDP issues from C++ and barriers included, the same on every rank that issues them: a rank whose count is
    behind the others' never issued their newest one.  No kind (the count has none), no dump, one call.
    None while stepping, without a process group, or where this torch has no count."""
    if since_step_s is None or since_step_s < STUCK_AFTER_S:
        return None
    c10d: Any = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None:
        return None
    try:
        if not c10d.is_initialized():
            return None
        group = c10d._get_default_group()
        return Collective(name="", seq=int(group._get_sequence_number_for_group()), state=ISSUED, group="default_pg")
    except Exception:
        return None
