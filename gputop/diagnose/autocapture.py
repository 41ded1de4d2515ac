"""A profile taken when a finding fires: which rank to ask and when, and the capture put on its finding.

When a straggler or stall finding has held for its alert time (the
``AlertTracker``'s notion of held), its culprit rank is asked for one short
``torch.profiler`` capture over the existing channel (``CaptureRequest``: a
few steps, its result bounded by the protocol).  At most once while a finding
holds, and at most one capture per run every ``CAPTURE_MIN_INTERVAL_S``.  A hang is
not asked: its rank takes no step, so a capture would never start (the
reporter gives up after 2 minutes without a step); the hang finding already
names where each stuck rank is from its stack samples.

The capture comes back like any capture (the store keeps it, recordings write
it); its id says what it was for (``auto-<cause>-r<rank>-<time>-<run hash>``), so the
live pipeline and ``gputop report`` attach it to the finding of that cause and
rank the same way: its top operators, its trace and the stack samples over the
seconds it spans (the profiler sees operators, not plain Python: the samples
name the user's code the operators miss).

Pure like the rest of the diagnosis: findings, figures and times in; requests
and findings out.  The caller carries the requests to its source.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Sequence

from gputop.diagnose.details import StallDetails
from gputop.diagnose.findings import Cause, Finding, FindingCapture, FindingKey
from gputop.model.figures import Figures
from gputop.model.frames import rank_frames
from gputop.model.snapshot import LIVE, RankSnapshot
from gputop.protocol import CaptureRequest, CaptureResult

# The causes whose culprit is one rank that still steps.  A hang's rank does not step: see the module's docstring.
AUTO_CAUSES: tuple[Cause, ...] = ("straggler", "stall")
# A few steps, as the dashboard's `c` asks: enough for the operators' shares, a trace small enough to open.
CAPTURE_STEPS = 5
# A stall stops one step in N: a capture of N+1 steps holds one stop, up to this many; a rarer stall's
# profile would grow with its steps, and its place is already named by the stack samples.
STALL_CAPTURE_MAX_STEPS = 25
# One capture per run at most every 10 minutes: the captured steps run about twice as slow under the
# profiler and each leaves a trace file on the rank's host, so a finding that flaps, or a straggler that
# rotates and so names new ranks each time, costs one profile per 10 minutes, not one per episode.
# One exception: a finding worse than the one the run's last capture was for (a critical straggler after a warn
# stall) is captured within the interval, once: the run's profile is of its worst problem, not its first.
CAPTURE_MIN_INTERVAL_S = 600.0
# How long the asker waits for the result: the reporter itself gives up after 2 minutes without a step.
CAPTURE_TIMEOUT_S = 120.0
# Live, a capture is attached once the rank's stack samples cover its end (they come once a second), or
# after this long without them.
FRAMES_WAIT_S = 3.0
# The result is made on the reporter thread at most a tick (0.25 s) after the last captured step, plus the
# trace's writing: the samples over the capture start this much before ``t - wall_s``.
RESULT_LAG_S = 1.0

# The run's part (a short hash of its id) keeps two runs' captures apart: the relay and the recording's
# reader key captures by id, and two jobs' rank 1 can straggle in the same second.
_ID = re.compile(r"^auto-(?P<cause>[a-z_]+)-r(?P<rank>\d+)-\d+(-[0-9a-f]{8})?$")


def capture_id(cause: str, rank: int, t: float, run_id: str = "") -> str:
    """The request's id: what the capture is for, so a recording's reader can attach it to its finding."""
    run = hashlib.sha1(run_id.encode()).hexdigest()[:8]
    return f"auto-{cause}-r{rank}-{int(t)}-{run}"


def captured_for(result: CaptureResult) -> tuple[str, int] | None:
    """The cause and rank an automatic capture was taken for; None for one asked by hand."""
    match = _ID.match(result.id)
    return None if match is None else (match["cause"], int(match["rank"]))


def culprit(finding: Finding) -> int | None:
    """The rank to profile: the one the evidence names among the finding's ranks (the slowest, the stopper)."""
    for evidence in finding.evidence:
        if evidence.rank is not None and evidence.rank in finding.ranks:
            return evidence.rank
    return finding.ranks[0] if finding.ranks else None


def capture_steps(finding: Finding) -> int:
    """A few steps; for a stall that comes every N steps, N+1 of them (one stop falls inside), up to a bound."""
    period = finding.details.period_steps if isinstance(finding.details, StallDetails) else None
    if isinstance(period, int) and period > 0:
        return max(CAPTURE_STEPS, min(period + 1, STALL_CAPTURE_MAX_STEPS))
    return CAPTURE_STEPS


def finding_capture(view: RankSnapshot, result: CaptureResult) -> FindingCapture:
    """The capture with the rank's stack samples over the seconds it spans (those that overlap them)."""
    start_t = result.t - result.wall_s - RESULT_LAG_S
    covering = tuple(s for s in view.stacks if s.t > start_t and s.t - s.period_s <= result.t)
    frames = rank_frames(dataclasses.replace(view, stacks=covering)) if result.ok and covering else None
    return FindingCapture(rank=result.rank, id=result.id, t=result.t, ok=result.ok, steps=result.steps,
                          wall_s=result.wall_s, trace_path=result.trace_path, top_ops=result.top_ops,
                          error=result.error, frames=frames)  # fmt: skip


def _covered(view: RankSnapshot, result: CaptureResult, now_t: float) -> bool:
    """Whether the samples over the capture are all in (or will not come): then it can be attached for good."""
    if not result.ok or not view.stacks or now_t - result.t >= FRAMES_WAIT_S:
        return True
    return view.stacks[-1].t >= result.t


def captures_in(
    figures: Figures, now_t: float | None = None, known: dict[str, tuple[str, FindingCapture]] | None = None
) -> dict[str, tuple[str, FindingCapture]]:
    """Every automatic capture the ranks answered, by id, with its run (None ``now_t``: a recording, all are in).

    ``known`` holds those already made (live, the samples they read leave the store after 30 s): they are kept.
    """
    found: dict[str, tuple[str, FindingCapture]] = {}
    for rank in figures.all_ranks():
        for result in rank.snapshot.captures:
            if captured_for(result) is None:
                continue
            if known is not None and result.id in known:
                found[result.id] = known[result.id]
            elif now_t is None or _covered(rank.snapshot, result, now_t):
                found[result.id] = (rank.run_id, finding_capture(rank.snapshot, result))
    return found


def with_captures(findings: Iterable[Finding], captures: dict[str, tuple[str, FindingCapture]]) -> list[Finding]:
    """Each straggler or stall finding with the newest automatic capture taken for its cause on one of its ranks."""
    by_finding: dict[tuple[str, str, int], FindingCapture] = {}
    for capture_key, (run_id, capture) in captures.items():
        what = _ID.match(capture_key)
        assert what is not None  # captures_in keeps only ids it could read
        key = (run_id, what["cause"], capture.rank)
        if key not in by_finding or by_finding[key].t < capture.t:
            by_finding[key] = capture
    out = []
    for f in findings:
        mine = [by_finding[k] for r in f.ranks if (k := (f.run_id or "", f.cause, r)) in by_finding]
        out.append(dataclasses.replace(f, capture=max(mine, key=lambda c: c.t)) if mine else f)
    return out


class AutoCapture:
    """The policy's state between refreshes: which findings were asked about, each run's last capture."""

    def __init__(self, *, min_interval_s: float = CAPTURE_MIN_INTERVAL_S) -> None:
        if min_interval_s < 0:
            raise ValueError("min_interval_s must not be negative")
        self.min_interval_s = min_interval_s
        self._asked: set[FindingKey] = set()  # findings asked about while they hold
        self._last_t: dict[str, float] = {}  # run id -> when its last capture was asked for
        self._last_severity: dict[str, int] = {}  # run id -> the severity rank of the finding it was for
        self._made: dict[str, tuple[str, FindingCapture]] = {}  # capture id -> its run and the capture, once made
        self._announced: set[str] = set()  # capture ids already handed out as news

    def due(self, held: Sequence[tuple[Finding, float]], figures: Figures, t: float) -> list[CaptureRequest]:
        """The captures to ask for now, given the findings that have held for their alert time."""
        holding = {f.key for f, _ in held}
        self._asked &= holding  # a finding that cleared may be asked about again when it holds again
        requests = []
        # A run's one capture goes to the worst of its findings that hold now, as the findings are shown (severity,
        # then the share of the step at stake), not to the one that began holding first: a few irregular stops at
        # the start of a run must not take the straggler's turn.
        for finding, _ in sorted(held, key=lambda fh: (-fh[0].severity_rank, -fh[0].stake)):
            run_id = finding.run_id
            if finding.cause not in AUTO_CAUSES or run_id is None or finding.key in self._asked:
                continue
            worse = finding.severity_rank > self._last_severity.get(run_id, finding.severity_rank)
            if t - self._last_t.get(run_id, float("-inf")) < self.min_interval_s and not worse:
                continue
            rank = culprit(finding)
            view = None if rank is None else figures.rank(f"{run_id}:{rank}")
            if rank is None or view is None or view.status != LIVE:
                continue  # not on the line now: asked when it is, rather than spend the run's turn on a refusal
            self._asked.add(finding.key)
            self._last_t[run_id] = t
            self._last_severity[run_id] = finding.severity_rank
            request_id = capture_id(finding.cause, rank, t, run_id)
            steps = capture_steps(finding)
            requests.append(
                CaptureRequest(run_id=run_id, rank=rank, id=request_id, steps=steps, timeout_s=CAPTURE_TIMEOUT_S)
            )
        return requests

    def attach(self, findings: Sequence[Finding], figures: Figures) -> tuple[list[Finding], list[Finding]]:
        """The findings with their captures, and those whose capture is new since the last call."""
        self._made = captures_in(figures, figures.t, self._made)  # the ids the store no longer keeps go
        out = with_captures(findings, self._made)
        new = [f for f in out if f.capture is not None and f.capture.id not in self._announced]
        self._announced.update(f.capture.id for f in new if f.capture is not None)
        self._announced &= self._made.keys()
        return out, new
