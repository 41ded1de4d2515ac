"""hang: no rank has finished a step for many times its usual step time.

A rank blocked for good (a lock, a queue, a forgotten ``input()``, a collective
another rank never joins) stops stepping, and in synchronous DDP every other
rank stops at its next all-reduce.  Their reporter threads keep sending
windows, so the ranks look alive; only their step counts stand still.

The line is relative to the job itself: several times the usual step and
twice the longest step seen lately (so a periodic checkpoint or evaluation
does not read as a hang), and never under ``HANG_MIN_S``.  Read from the
windows' step counts, so it works on a recording too: a run that ended hung
is reported hung.

Where the reporters sample their training thread's stack (``Stacks``), the
title names each stuck rank's place now: a rank waiting in a collective (or,
under DDP, in backward, where the gradient all-reduce runs) waits for the
others; the rest are where the hang is.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gputop.diagnose.details import HangDetails
from gputop.diagnose.findings import Evidence, Finding, Severity
from gputop.diagnose.rules.collective_positions import positions, read_positions, stopped_from_outside
from gputop.diagnose.thresholds import HANG_BUSY_CPU_PCT, HANG_LONGEST_FACTOR, HANG_MIN_S, HANG_STEP_FACTOR
from gputop.diagnose.wording import PLACES_NAMED, ranks_short, ranks_text
from gputop.model.collectives import HangCollective
from gputop.model.figures import RankFigures, RunFigures
from gputop.model.frames import Frame, RankFrames, collective_text, span_frames
from gputop.model.snapshot import DONE, LIVE
from gputop.protocol import Collective

# How far back from a rank's last step its usual and its longest step are read: long
# enough to include a periodic evaluation or checkpoint, short enough to follow the
# job.  A time, whatever the rank's window: a recording has all of it; a live view
# copies a rank's newest 40 windows (SPAN_COPY_WINDOWS), and a rank stopped for
# longer than those reach is read from its 40 newest with a step.
LOOKBACK_S = 240.0


def hang_findings(run: RunFigures, now_t: float) -> list[Finding]:
    """One finding for a run whose live ranks have all stopped stepping past the run's own line.

    With no live rank left, the ranks that went silent are judged at the time each did.
    """
    live = [r for r in run.ranks if r.status == LIVE and r.snapshot.windows]
    # With no rank reporting any more (a hung job killed, a recording's end), judge each by the time it
    # went silent: a job that was hung when it was stopped is reported hung, after the run as during it.
    ended = not live
    judged = live or [r for r in run.ranks if r.snapshot.windows and stopped_from_outside(r)]
    stops = stopped_ranks(judged, now_t, ended)  # measure
    if stops is None or not stops.stuck:
        return []
    stuck = [r for r, _, _ in stops.stuck]
    ranks = [r.rank for r in stuck]
    busy = [r.rank for r in stuck if _cpu_since_last_step(r) >= HANG_BUSY_CPU_PCT]
    # Decide: all of them busy on the CPU is a long stop of its own; any one blocked is a hang.
    severity: Severity = "warn" if busy and len(busy) == len(ranks) else "critical"
    frames = {r.rank: f for r in stuck if (f := span_frames(r)) is not None and f.now is not None}
    # A rank that went silent meanwhile is part of it: dead, or blocked in a call that holds the GIL,
    # so its reporter thread cannot send (seen with gloo: the rank waiting in the all-reduce).
    lost = stops.silent if ended else [v.rank for v in run.lost]
    # A silent rank's last numbers say where it was when it fell silent (a peer stopped inside the exchange).
    silent = [r for r in run.ranks if r.rank in lost and r not in stuck]
    silent_frames = {r.rank: f for r in silent if (f := span_frames(r)) is not None}
    reading = read_positions(positions(stuck + silent, frames | silent_frames), ranks + lost)
    named = list(reading.culprits) if reading is not None and reading.culprits else hung_ranks(stuck, frames, lost)
    return [
        Finding(
            cause="hang",
            severity=severity,
            title=hang_title(stops, ended, busy, frames, lost, reading),
            suggestion=HANG_SUGGESTION + ("" if reading is None else " " + READING_SUGGESTIONS[reading.reading]),
            evidence=(Evidence("seconds_without_a_step", stops.idle_s, stops.line_s, " s", op=">="),),
            ranks=tuple(named),
            run_id=run.run_id,
            magnitude=1.0,
            waiting_ranks=tuple(sorted(set(ranks + lost) - set(named))),
            frames=tuple(frames.values()),
            details=HangDetails(
                since_step=stops.since[0], busy_ranks=tuple(busy), lost_ranks=tuple(lost), collective=reading
            ),
        )
    ]


def ending_text(ranks: Sequence[RankFigures]) -> str:
    """ "then ended by SIGTERM", "then rank 0 ended by SIGTERM, rank 1 failed: …, rank 2 stopped reporting": how
    the stuck ranks ended, from their byes; "" where none said bye (the title says they stopped reporting)."""
    reasons = {r.rank: ended_reason(r.snapshot.status_reason) if r.status == DONE else "" for r in ranks}
    if not any(reasons.values()):
        return ""
    if len(set(reasons.values())) == 1:
        return f"then {next(iter(reasons.values()))}"
    said = [f"rank {rank} {reason or 'stopped reporting'}" for rank, reason in sorted(reasons.items())]
    return "then " + ", ".join(said[:PLACES_NAMED]) + (", …" if len(said) > PLACES_NAMED else "")


# What a backend says when a collective fails for a hang: NCCL's watchdog names the collective by torch's number,
# gloo the wait that timed out.
NCCL_WATCHDOG = re.compile(r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), OpType=(\w+)")
GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (\w+) operation")
OP_KINDS = {"ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather", "_ALLGATHER_BASE": "all_gather",
            "REDUCE_SCATTER": "reduce_scatter", "_REDUCE_SCATTER_BASE": "reduce_scatter", "BROADCAST": "broadcast",
            "ALLTOALL_BASE": "all_to_all", "BARRIER": "barrier", "SEND": "send", "RECV": "recv"}  # fmt: skip


def ended_reason(reason: str) -> str:
    """A bye's reason, said short where the backend's words name the failure: "failed in all_reduce #46 (NCCL's
    watchdog timed out)", "failed: gloo timed out after 8 s waiting to recv"; else as the bye said it."""
    if found := NCCL_WATCHDOG.search(reason):
        kind = OP_KINDS.get(found[2], found[2].lower())
        return f"failed in {kind} #{found[1]} (NCCL's watchdog timed out)"
    if found := GLOO_TIMEOUT.search(reason):
        return f"failed: gloo timed out after {int(found[1]) / 1000:g} s waiting to {found[2]}"
    return reason


@dataclass(frozen=True)
class Stops:
    """The judged ranks that have not stepped for longer than their line (``stopped_ranks``)."""

    stuck: list[tuple[RankFigures, float, int]]  # (rank, seconds since its last step, its step count)
    silent: list[int]  # ended: ranks whose reporting stopped with their steps (starved or dead, can't tell)
    line_s: float  # the longest of the ranks' lines

    @property
    def idle_s(self) -> float:
        return min(idle for _, idle, _ in self.stuck)

    @property
    def since(self) -> list[int]:
        return sorted({total for _, _, total in self.stuck})


@dataclass(frozen=True)
class StepClock:
    """A rank's hang clock: when its last step ended, and how long without one reads as hung for this job."""

    last_step_t: float  # unix time: the end of the newest window in which a step ended
    step_total: int  # its step count then
    line_s: float  # the line: several usual steps, twice the longest lately, never under HANG_MIN_S


def step_clock(rank: RankFigures) -> StepClock | None:
    """The rank's clock from its recent windows; None before its first step (nothing to compare with).

    The Prometheus exporter publishes it (seconds since the step, and the line) so that the cluster's rules
    call a hang where this rule does.
    """
    windows = rank.snapshot.windows
    # Anchored at its last step, not at now: a rank stopped for longer than the lookback keeps its clock.
    last = next((i for i in range(len(windows) - 1, -1, -1) if windows[i].steps > 0), None)
    if last is None:  # stopped for longer than its copied windows reach: the store kept its last steps apart
        windows = rank.snapshot.stepped
        last = len(windows) - 1
        if last < 0:
            return None
    since, first = windows[last].t1 - LOOKBACK_S, last
    while first > 0 and windows[first - 1].t1 >= since:  # back to the lookback's start, not the run's
        first -= 1
    stepped = [w for w in windows[first : last + 1] if w.steps > 0]
    medians = [w.step_time_p50_s for w in stepped if w.step_time_p50_s is not None]
    usual = statistics.median(medians) if medians else 0.0
    longest = max((w.step_time_max_s or 0.0 for w in stepped), default=0.0)
    line = max(HANG_MIN_S, HANG_STEP_FACTOR * usual, HANG_LONGEST_FACTOR * longest)
    return StepClock(stepped[-1].t1, stepped[-1].step_total, line)


def stopped_ranks(judged: list[RankFigures], now_t: float, ended: bool) -> Stops | None:
    """Each judged rank's time since its last step against its line; None while any still steps or starts."""
    if not judged:
        return None
    stuck: list[tuple[RankFigures, float, int]] = []
    silent: list[int] = []
    line_s = 0.0
    for rank in judged:
        clock = step_clock(rank)
        if clock is None:
            return None  # still starting: nothing to compare with
        line_s = max(line_s, clock.line_s)
        idle = (rank.snapshot.windows[-1].t1 if ended else now_t) - clock.last_step_t
        if idle >= clock.line_s:
            stuck.append((rank, idle, clock.step_total))
        elif ended:
            silent.append(rank.rank)
        else:
            return None  # one rank still steps: not a hang (a straggler or a stall is someone else's finding)
    return Stops(stuck, silent, line_s)


def hang_title(
    stops: Stops,
    ended: bool,
    busy: list[int],
    frames: dict[int, RankFrames],
    lost: list[int],
    reading: HangCollective | None = None,
) -> str:
    """'rank 1 has not finished a step for 42 s (after step 10): hung; <where each is>; <which collective>'."""
    stuck = [r for r, _, _ in stops.stuck]
    ranks = [r.rank for r in stuck]
    since = stops.since
    where = f"after step {since[0]}" if len(since) == 1 else f"after steps {since[0]}-{since[-1]}"
    verb = "had" if ended else "has" if len(ranks) == 1 else "have"
    title = f"{ranks_text(ranks)} {verb} not finished a step for {stops.idle_s:.0f} s ({where})"
    ending = ending_text(stuck) if ended else ""
    if ended and not ending:
        title += " when they stopped reporting" if len(ranks) > 1 else " when it stopped reporting"
    if busy and len(busy) == len(ranks):
        title += ", busy on the CPU: a long evaluation or save, or a loop that never reaches the step"
    else:
        title += ": hung" + (f"; {ranks_text(busy)} busy on the CPU" if busy else "")
    said = () if reading is None else reading.waiting
    places = where_stuck_text(stuck, frames, said, past=bool(ending)) if frames else ""
    if places:
        title += "; " + places
    entered = {rank: f.collective for rank, f in frames.items() if f.collective is not None}
    if reading is not None:
        title += "; " + reading_text(reading, frames, past=bool(ending))
    elif entered:
        title += "; " + flight_recorder_text(entered)
    if lost:
        title += f"; {ranks_text(lost)} stopped reporting (dead, or blocked holding the GIL)"
    return title + (f"; {ending}" if ending else "")


HANG_SUGGESTION = (
    "See where each rank is: py-spy dump --pid <rank pid> (the rank detail screen names the pid). A rank blocked on "
    "a lock, a queue or input() holds the others in their next all-reduce; a rank that died leaves them there too. "
    "TORCH_FR_BUFFER_SIZE=2000 (TORCH_NCCL_TRACE_BUFFER_SIZE for NCCL in older torch) turns on torch's Flight "
    "Recorder: gputop then names the last collective each rank entered."
)


def hung_ranks(stuck: list[RankFigures], frames: dict[int, RankFrames], lost: list[int]) -> list[int]:
    """The ranks the hang is on, not those that wait for them.

    A stuck rank whose stack shows it somewhere other than a collective (a
    lock, a queue, ``input()``) is where the hang is, and the others wait for
    it, those gone silent included (with gloo a rank waiting in DDP's all-reduce
    holds the GIL and its reporter stops).  When every stuck rank that can say
    waits for the others, the silent ones are where it is: dead, or blocked.
    Without stacks to tell, every stuck and silent rank is named.
    """
    places = {r.rank: (r, frames[r.rank].now) for r in stuck if r.rank in frames}
    culprits = [rank for rank, (r, now) in places.items() if now is not None and not waits_for_others(r, now)]
    if culprits:
        return sorted(culprits)
    if lost and len(places) == len(stuck):
        return sorted(lost)
    return sorted({r.rank for r in stuck} | set(lost))


def flight_recorder_text(entered: dict[int, Collective]) -> str:
    """ "Flight Recorder: rank 0 entered gloo:all_reduce #41, rank 1's last was #40": who never joined.

    Ranks that entered the newest collective wait in it; a rank whose last one
    is older never joined it.  Where only one rank could say (with gloo, a rank
    waiting in DDP's all-reduce holds the GIL and its reporter falls silent),
    or all say the same, that is all the title claims.
    """
    newest = max(entered.values(), key=lambda c: c.seq)
    joined = sorted(rank for rank, c in entered.items() if c.seq == newest.seq)
    behind = sorted((rank, c) for rank, c in entered.items() if c.seq != newest.seq)
    # The recorder's entries name the collective; the process group's count only numbers it.
    source = "Flight Recorder: " if any(c.name for c in entered.values()) else ""
    if not behind:
        verb = ("'s last collective was" if source else "'s last was") if len(joined) == 1 else " last entered"
        return f"{source}{ranks_text(joined)}{verb} {collective_text(newest)}"
    text = f"{source}{ranks_text(joined)} entered {collective_text(newest)}"
    return text + ", " + ", ".join(f"rank {rank}'s last was {collective_text(c)}" for rank, c in behind)


def waits_for_others(rank: RankFigures, now: Frame) -> bool:
    """Whether a stuck rank's place is a wait for the other ranks: a collective, or DDP's backward (its all-reduce)."""
    return now.where == "collective" or (now.where == "backward" and bool(rank.hello.ddp))


def where_stuck_text(
    stuck: list[RankFigures], frames: dict[int, RankFrames], said: Sequence[int] = (), *, past: bool = False
) -> str:
    """ "rank 1 is in `wait_for_lock` (train.py:102), after the optimizer step; rank 0 waits in the all-reduce".

    ``said``: ranks whose numbered collective the title names apart (``reading_text``): left out here."""
    culprits: dict[str, list[int]] = {}  # where a rank is -> the ranks there, in rank order
    waiting: dict[str, list[int]] = {}
    for rank in stuck:
        now = frames[rank.rank].now if rank.rank in frames else None
        if now is None or rank.rank in said:
            continue
        if not waits_for_others(rank, now):
            culprits.setdefault(now.text(), []).append(rank.rank)
        elif now.where == "backward":
            waiting.setdefault("in the all-reduce", []).append(rank.rank)
        else:
            waiting.setdefault(f"in a collective from {now.place}" if now.file else "in a collective", []).append(
                rank.rank
            )
    be = ("was", "were", "waited", "waited") if past else ("is", "are", "waits", "wait")
    parts = [f"{ranks_short(r)} {be[0] if len(r) == 1 else be[1]} {text}" for text, r in culprits.items()]
    parts += [f"{ranks_short(r)} {be[2] if len(r) == 1 else be[3]} {text}" for text, r in waiting.items()]
    if len(parts) > PLACES_NAMED:
        parts = [*parts[:PLACES_NAMED], "…"]
    return "; ".join(parts)


def reading_text(reading: HangCollective, frames: dict[int, RankFrames], *, past: bool = False) -> str:
    """ "rank 0 waits in all_reduce #21 on world (from `main` (job.py:190)), which rank 1 never issued (its last:
    #20)"; at scale "4,093 ranks wait in all_gather #88 on dp ..., which ranks 17, 345, 800 never issued"."""
    waiting = reading.waiting
    nows = [frames[r].now for r in waiting if r in frames]
    places = {now.place for now in nows if now is not None}
    site = f" (from {places.pop()})" if len(places) == 1 and "" not in places else ""
    verb = ("waited in" if past else "waits in" if len(waiting) == 1 else "wait in") if reading.blocked_in else "issued"
    text = f"{ranks_short(waiting, 2)} {verb} {reading.waited.text()}{site if reading.blocked_in else ''}"
    if reading.reading == "never_issued":
        culprits = reading.culprits
        text += f", which {ranks_short(culprits)} never issued"
        if len({count for _, count in reading.never_issued}) == 1:
            text += f" ({'its' if len(culprits) == 1 else 'their'} last: #{reading.never_issued[0][1]})"
    elif reading.reading == "none_completed":
        text += ": every rank issued it and none completed it, so the exchange itself is stuck"
    if reading.elsewhere:
        shown = reading.elsewhere[:PLACES_NAMED]
        text += "; " + ", ".join(f"rank {rank} in {c.text()}" for rank, c in shown)
        text += (", …" if len(reading.elsewhere) > len(shown) else "") + ": the ranks are in different collectives"
    return text


READING_SUGGESTIONS = {
    "never_issued": "The ranks that never issued the collective hold the others: why did they not reach it (a lock, "
    "a queue, a branch on the rank or on the data that skips a collective)? Their frames are in the title.",
    "none_completed": "Every rank issued the collective and none completed it: look at the exchange itself, a peer "
    "process stopped or dead (ps, dmesg), the network, the backend's own log (NCCL_DEBUG=INFO); a process group "
    "timeout (init_process_group(timeout=...)) makes it fail instead of hang.",
    "different": "The ranks wait in different collectives: their code paths differ (a branch on the rank or on the "
    "data); the collectives must be issued in the same order on every rank of a group.",
    "silent": "The ranks that said nothing are silent or dead: py-spy dump --pid <pid> shows where they are.",
}


def _cpu_since_last_step(rank: RankFigures) -> float:
    """The rank's mean CPU% (100 = one core) over its windows since its last step; 0 when unknown."""
    windows = rank.snapshot.windows
    last = max((i for i, w in enumerate(windows) if w.steps > 0), default=-1)
    after = [w.cpu_pct for w in windows[last + 1 :] if w.cpu_pct is not None]
    return sum(after) / len(after) if after else 0.0
