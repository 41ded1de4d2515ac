"""Where a rank's training thread spends its time, from the stack samples its reporter sends (``Stacks``).

Pure: a rank's view in, the places most samples found its training thread and
where it was at the newest sample out, with the words the detail screen, the
report and the findings share, so "38% in `compute_metrics` (train.py:57),
after the optimizer step" reads the same in each.  A rank whose reporter
does not sample (an older gputop, ``GPUTOP_STACKS=0``) has no frames: None.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gputop.model.snapshot import RankSnapshot
from gputop.protocol import MAX_STACKS_TOP, STACKS_TOP, Collective, GroupCalls, SampledFrame, StackFrame, Stacks

if TYPE_CHECKING:
    from gputop.model.figures import RankFigures

# What the training thread was inside, in words: the reporter's ``where`` values.
WHERE_TEXT = {
    "loader": "waiting for a batch",
    "forward": "in the forward pass",
    "backward": "in the backward pass",
    "optimizer": "in the optimizer step",
    "collective": "in a collective (all-reduce, barrier, ...)",
    "after_step": "after the optimizer step",
    "before_step": "between the forward pass and the optimizer step",
    "outside": "outside the model and the optimizer",
}
# Places outside the model's phases and the loader: time the user's own code takes (a metric, a save, a lock).
OUTSIDE_PHASES = frozenset({"after_step", "before_step", "outside"})

FrameKey = tuple[str, str, int, str]  # where, file, line, function


@dataclass(frozen=True)
class Frame:
    """One place: what the thread was inside (``where``) and its innermost frame in the user's code."""

    where: str
    file: str  # "" when no frame of the user's code was on the stack
    line: int
    function: str

    @property
    def place(self) -> str:
        """ "`compute_metrics` (train.py:57)", or "" without a frame of the user's code."""
        return f"`{self.function}` ({self.file}:{self.line})" if self.file else ""

    @property
    def where_text(self) -> str:
        return WHERE_TEXT.get(self.where, f"in {self.where}")

    def text(self) -> str:
        """ "in `wait_for_lock` (train.py:102), outside the model and the optimizer"."""
        return f"in {self.place}, {self.where_text}" if self.file else self.where_text

    def to_dict(self) -> dict[str, Any]:
        return {"where": self.where, "file": self.file, "line": self.line, "function": self.function}


@dataclass(frozen=True)
class FrameShare:
    """A place and the share of the samples that found the training thread there."""

    frame: Frame
    samples: int
    share: float  # of every sample in the span, 0..1

    def text(self) -> str:
        """ "38% in `compute_metrics` (train.py:57), after the optimizer step"."""
        return f"{self.share * 100:.0f}% {self.frame.text()}"

    def to_dict(self) -> dict[str, Any]:
        return {**self.frame.to_dict(), "samples": self.samples, "share_pct": round(self.share * 100, 1)}


@dataclass(frozen=True)
class RankFrames:
    """Where one rank's training thread was: now (the newest sample) and most often over a span."""

    rank: int
    now: Frame | None  # None: the newest message had no sample (the training thread had ended)
    now_t: float  # unix time of the newest sample
    samples: int  # samples in the span
    top: tuple[FrameShare, ...]  # most samples first
    interval_s: float  # the reporter's sampling interval at the newest message
    # The collective the rank entered last (torch's Flight Recorder), sent while it is stuck; else None.
    collective: Collective | None = None
    # Each process group's collectives numbered (the collective tap and torch's count), sent while it is stuck.
    groups: tuple[GroupCalls, ...] | None = None

    def outside_phases(self) -> tuple[FrameShare, ...]:
        """The places in the user's own code outside the model, the optimizer and the loader, most sampled first."""
        return tuple(f for f in self.top if f.frame.where in OUTSIDE_PHASES and f.frame.file)

    def text(self, places: int = 3) -> str:
        """ "now in `wait_for_lock` (train.py:102), ...; most: 38% in `compute_metrics` (train.py:57), ..."."""
        parts = [f"now {self.now.text()}" if self.now is not None else "now: not sampled"]
        if self.top:
            parts.append("most: " + ", ".join(f.text() for f in self.top[:places]))
        if self.collective is not None:
            parts.append(f"last collective entered: {collective_text(self.collective)} (Flight Recorder)")
        if self.groups:
            parts.append("collectives: " + ", ".join(group_text(g) for g in self.groups))
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "now": None if self.now is None else self.now.to_dict(),
            "now_t": self.now_t,
            "samples": self.samples,
            "sample_interval_ms": round(self.interval_s * 1e3, 1),
            "top": [f.to_dict() for f in self.top],
            "collective": None if self.collective is None else collective_dict(self.collective),
            "groups": None if self.groups is None else [group_dict(g) for g in self.groups],
        }


def rank_frames(view: RankSnapshot, since_t: float | None = None, top: int = STACKS_TOP) -> RankFrames | None:
    """The rank's places over the stacks messages newer than ``since_t`` (None: all it kept); None if it sent none.

    A place is a function of the user's code and what the thread was inside,
    shown at the line most of its samples found.
    """
    if not view.stacks:
        return None
    latest = view.stacks[-1]
    chosen = [s for s in view.stacks if since_t is None or s.t > since_t]
    tally, samples = _tally(chosen)
    ranked = sorted(tally.items(), key=lambda item: (-item[1], item[0]))[:top]
    return RankFrames(
        rank=view.rank,
        now=None if latest.now is None else _frame(latest.now),
        now_t=latest.t,
        samples=samples,
        top=tuple(
            FrameShare(Frame(*key), count, count / samples if samples else 0.0) for key, count in ranked if count
        ),
        interval_s=latest.interval_s,
        collective=latest.collective,
        groups=latest.groups,
    )


def collective_dict(collective: Collective) -> dict[str, Any]:
    return {"name": collective.name, "seq": collective.seq, "state": collective.state, "group": collective.group}


def group_dict(group: GroupCalls) -> dict[str, Any]:
    return {
        "group": group.group, "seq": group.seq, "issued": group.issued, "completed": group.completed,
        "kind": group.kind, "bytes": group.bytes, "inside": group.inside,
        "waits": group.waits, "waits_kind": group.waits_kind, "waits_bytes": group.waits_bytes,
    }  # fmt: skip


def group_text(group: GroupCalls) -> str:
    """ "in all_reduce #105 on world (4 B)" while the rank is in it; "waits for all_gather #89 on tp (8,192 B), issued
    before #90" while it waits for one issued earlier; else "#104 on world", its group's count."""
    if group.seq is None:
        return f"{group.issued} issued on {group.group}"
    if group.inside:
        size = "" if group.bytes is None else f" ({group.bytes:,} B)"
        return f"in {group.kind} #{group.seq} on {group.group}{size}"
    if group.waits is not None:
        size = "" if group.waits_bytes is None else f" ({group.waits_bytes:,} B)"
        newer = f", issued before #{group.seq}" if group.seq > group.waits else ""
        return f"waits for {group.waits_kind} #{group.waits} on {group.group}{size}{newer}"
    return f"#{group.seq} on {group.group}"


def collective_text(collective: Collective) -> str:
    """ "gloo:all_reduce #41" (the process group's sequence number); "collective #41 on default_pg" where only
    the group's count is known (no Flight Recorder)."""
    if not collective.name:
        return f"collective #{collective.seq}" + (f" on {collective.group}" if collective.group else "")
    return f"{collective.name} #{collective.seq}"


def span_frames(rank: RankFigures, top: int = STACKS_TOP) -> RankFrames | None:
    """The rank's ``top`` places over the span its figures cover (the whole run in a report).

    Read from ``RankFigures.frames``, tallied once a summary at the most places the wire
    carries: a shorter top is its first places, each with the same share.
    """
    frames = rank.frames
    if frames is None or len(frames.top) <= top:
        return frames
    return replace(frames, top=frames.top[:top])


def merge_stacks(messages: Sequence[Stacks]) -> Stacks:
    """Several stacks messages of one rank as one (recordings merge old ones): counts add, the newest ``now``.

    Each message names only its top places, so the merge keeps the most
    counted of those, up to the wire's ``MAX_STACKS_TOP``.
    """
    tally, samples = _tally(messages)
    ranked = sorted(tally.items(), key=lambda item: (-item[1], item[0]))[:MAX_STACKS_TOP]
    last = messages[-1]
    return Stacks(
        run_id=last.run_id,
        rank=last.rank,
        t=last.t,
        period_s=sum(m.period_s for m in messages),
        interval_s=last.interval_s,
        samples=samples,
        top=tuple(SampledFrame(*key, count) for key, count in ranked),
        now=last.now,
        collective=last.collective,
        groups=last.groups,
    )


def _tally(messages: Iterable[Stacks]) -> tuple[dict[FrameKey, int], int]:
    """Samples per place over the messages, and all their samples.

    A place is a function (where, file, function) under the line most of its
    samples found: messages may name different lines of one function, and it
    is one place taking its share.
    """
    per_line: dict[FrameKey, int] = {}
    samples = 0
    for message in messages:
        samples += message.samples
        for f in message.top:
            key = (f.where, f.file, f.line, f.function)
            per_line[key] = per_line.get(key, 0) + f.count
    totals: dict[tuple[str, str, str], int] = {}
    top_line: dict[tuple[str, str, str], int] = {}
    for (where, file, line, function), count in sorted(per_line.items(), key=lambda item: (-item[1], item[0])):
        place = (where, file, function)
        totals[place] = totals.get(place, 0) + count
        top_line.setdefault(place, line)
    tally = {
        (where, file, top_line[where, file, function], function): n for (where, file, function), n in totals.items()
    }
    return tally, samples


def _frame(frame: StackFrame) -> Frame:
    return Frame(frame.where, frame.file, frame.line, frame.function)
