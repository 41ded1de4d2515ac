"""Which rank the others waited for, step by step: one rank always (chronic), or a different one each time.

DDP ends every step with an all-reduce that no rank leaves before the last one
enters, so in each step the others wait for the rank that was ready last.  Each
window says, for its steps (``Window.ready_s``, thinned by step number alike on
every rank), how long after the step began the rank's last training forward
ended: when it was ready for backward and so for the exchange.  Joined by step
number across ranks, the latest of them is the step's slowest rank, when it is
later than the others' median by more than the noise of ranks doing the same
work (``SLOWEST_LINE_FRAC`` of a step).

Windows also say how long each of those forwards took (``Window.ready_forward_s``) and how many
elements its input held (``Window.ready_input_numel``).  Where the inputs vary in size and each
rank's forwards take longer with larger inputs (texts padded to their longest: a rank correlation of
``INPUT_DRIVEN_MIN_CORRELATION`` or more between the two), the step's work is the data's: the backward
that follows takes about twice the forward, so a rank with a longer batch is later still when its
backward ends, and that is what the others wait for.  Readiness is then read at the backward's end
(``ready + 2 x forward``) and the noise from what came before each forward.  Elsewhere a forward's
length is not a sign of its work: on 2 shared cores a healthy job's forwards vary by a fifth to a
quarter of themselves from step to step, a third under a neighbour, and read at the backward's end
that noise made the healthy demo rotate (issue #35); such jobs keep the forward's end.

Counted over many steps, that tells a chronic straggler (the same rank in most
steps: its host, its device, work only it does) from a rotating one (uneven
batches, a noisy neighbour that moves, work done by whichever rank draws it),
which per-rank means cannot: they average a rotation away and show only that
everyone waits.  It sees what happens on the CPU before the exchange (the
loader, Python work, forward, and the launches of a GPU forward), not a GPU
whose kernels run slower.

Where collectives run through the whole step (FSDP2's all-gathers before each
block, tensor parallelism's all-reduce in each layer, ZeRO), the forward's own
collectives line the ranks up and readiness says nothing: a rank with extra
work each step reaches the first all-gather of the next forward last, and the
others wait there, long before any forward ends.  Every rank leaves each such
collective together, so a rank's step is the same length as the others' and
divides into its own work and its waits: the last to arrive at a collective
waits least, and over the step the rank with the most own work
(``Window.work_s``: the step less the time it waited in collectives, timed by
the collective tap, or by CUDA events on the GPU) is the one the others waited
for.  Where the ranks send it, that is read in place of readiness
(``SlowestRanks.by_work``); DDP's reducer all-reduces in C++, out of the tap's
sight, and keeps readiness, which is right there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gputop.combine import ready_steps
from gputop.model.stalls import STALL_FACTOR
from gputop.model.statistics import median, standard_error
from gputop.protocol import Window

# gputop: a step has a slowest rank when the rank ready last is later than the others' median by at least
# this share of the typical step: half the straggler's line, so the others wait for it a twentieth of that
# step.  Ranks doing the same work on 2 shared cores are ready within ~1-3% of a step of each other
# (docs/diagnosis.md, "Chronic or rotating"), so a tie is not read as a slowest rank.
SLOWEST_LINE_FRAC = 0.05
# gputop: nor when it is within this many times the job's own jitter: the spread of a rank's readiness over
# the steps in which it was not the latest (its interquartile range).  Three IQRs is about four standard
# deviations of a normal jitter, which a difference of two such ranks exceeds in under 1% of the steps.
NOISE_FACTOR = 3.0
# Fewer steps than this in which a rank was not the latest say nothing of its jitter.
MIN_NOISE_STEPS = 8
# gputop: one rank is the slowest, not one of several, when it is so in at least this part of the steps
# that have a slowest rank; a rotation among n ranks gives each about 1/n.
ONE_RANK_MIN_PART = 0.75
# gputop: the slowest rank rotates when at least this share of the compared steps has a slowest rank
# and no one rank holds ONE_RANK_MIN_PART of them.  Fewer, and most steps are ties: nobody waits much.
ROTATING_MIN_STEPS_FRAC = 0.25
# Fewer compared steps than this tell nothing about a pattern (a few seconds of a slow job).
MIN_COMPARED_STEPS = 20
# A step whose slowest rank kept the others waiting this many typical steps or more made their step a stall
# (STALL_FACTOR x the median): a checkpoint save, an evaluation pass, a GC pause.  Such stops are the stall
# rule's business, counted apart here: ten of them by one rank among noise would otherwise read as a rotation,
# and their waits, each many steps long, would swamp the waits of the ordinary steps.
STALL_MARGIN_STEPS = STALL_FACTOR - 1.0
# gputop: a rank's forwards follow its inputs when their lengths and the inputs' sizes rank alike to at least this
# Spearman correlation over the steps compared: padded text batches give 0.9-1.0 under a neighbour, and inputs of
# one size give no correlation at all (their sizes do not vary; see INPUT_VARIES_MIN_FRAC).
INPUT_DRIVEN_MIN_CORRELATION = 0.7
# gputop: and when the inputs' sizes vary by at least this share of their median (interquartile range): a last
# batch shorter than the rest, or a rare long text, is no pattern of the data.
INPUT_VARIES_MIN_FRAC = 0.1
# The backward of a step takes about this many times its forward (twice the arithmetic: gradients with respect
# to both the inputs and the weights), so its end is that much later for a larger input.
BACKWARD_PER_FORWARD = 2.0
# The join costs a dictionary entry per rank and step: at most this many, newest steps first (200 steps
# of 100 ranks, 20 of 1,000), so the dashboard's refresh stays cheap at any scale.
MAX_COMPARED_ENTRIES = 20_000


@dataclass(frozen=True)
class SlowestRanks:
    """Over the steps compared, in how many each rank was the one the others waited for."""

    steps: int  # steps that at least two ranks (and half of them) timed
    slowest: dict[int, int]  # rank -> steps in which it was ready last by more than the line (not a stall)
    waited_s: float  # per compared step, how long the typical rank waited for the slowest (0 in ties)
    waited_se_s: float | None  # its standard error over the steps
    line_s: float  # how much later than the others a rank had to be ready to count as a step's slowest
    step_s: float  # the typical step the line and the waits are shares of
    # rank -> compared steps in which the others waited for it a stall's length (see STALL_MARGIN_STEPS):
    # not in ``slowest``, ``steps`` or the waits, which describe the ordinary steps.
    stalled: dict[int, int] = field(default_factory=dict)
    # rank -> per compared step, how long it waited for that step's slowest rank (0 in ties and in its own)
    waited_by_rank: dict[int, float] = field(default_factory=dict)
    # When the ranks' forwards follow their inputs' sizes (readiness read at the backward's end): the median
    # over the ranks of that rank correlation; None when they do not, or the windows do not say.
    input_driven: float | None = None
    # Read from each step's own work (the step less its waits in collectives), not from readiness (the module).
    by_work: bool = False

    @property
    def decided_steps(self) -> int:
        """Steps that had a slowest rank (not a tie within the line)."""
        return sum(self.slowest.values())

    def share(self, rank: int) -> float:
        """Of the compared steps, the part in which ``rank`` was the slowest."""
        return self.slowest.get(rank, 0) / self.steps if self.steps else 0.0

    def by_share(self) -> list[tuple[int, float]]:
        """(rank, share) of every rank that was ever the slowest, most often first."""
        return sorted(((r, self.share(r)) for r in self.slowest), key=lambda pair: (-pair[1], pair[0]))

    @property
    def one_rank(self) -> int | None:
        """The rank that is the slowest in most steps that have one; None when it rotates or ties."""
        decided = self.decided_steps
        if self.steps < MIN_COMPARED_STEPS or not decided:
            return None
        rank, count = max(self.slowest.items(), key=lambda item: (item[1], -item[0]))
        return rank if count >= ONE_RANK_MIN_PART * decided else None

    @property
    def rotates(self) -> bool:
        """Most waits are for some rank, and no one rank is the slowest in most of them."""
        return (
            self.steps >= MIN_COMPARED_STEPS
            and self.decided_steps >= ROTATING_MIN_STEPS_FRAC * self.steps
            and self.one_rank is None
            and len(self.slowest) >= 2
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "steps": self.steps,
            "slowest_share": {str(rank): round(share, 4) for rank, share in self.by_share()},
            "waited_ms": round(1e3 * self.waited_s, 3),
            "line_ms": round(1e3 * self.line_s, 3),
            "rotates": self.rotates,
            "one_rank": self.one_rank,
            "stalled_steps": {str(rank): count for rank, count in sorted(self.stalled.items())},
            "input_driven": None if self.input_driven is None else round(self.input_driven, 3),
            "from": "work" if self.by_work else "readiness",
        }


def slowest_ranks(ranks: Sequence[tuple[int, Sequence[Window]]], step_s: float) -> SlowestRanks | None:
    """Each compared step's slowest rank, from each rank's windows (oldest first) and the typical step time.

    A step has a slowest rank when the latest-ready rank is later than the others'
    median by the line: ``SLOWEST_LINE_FRAC`` of the step, or the job's own noise
    when that is larger (``NOISE_FACTOR`` times the ranks' typical spread of
    readiness over the steps in which they were not the latest).  None when fewer
    than two ranks say when they were ready (older reporters, one rank).
    """
    by_work = sum(any(w.work_s for w in windows) for _, windows in ranks) >= 2
    timed = _timed_steps(ranks, by_work)
    if timed is None or step_s <= 0:
        return None
    driven = input_driven(timed)
    by_step = _by_step(timed, at_backward_end=driven is not None)
    if by_work:
        by_step = _from_the_median(by_step)
    if not by_step:
        return None
    line_s = max(SLOWEST_LINE_FRAC * step_s, NOISE_FACTOR * _noise_s(by_step))
    slowest: dict[int, int] = {}
    stalled: dict[int, int] = {}
    waits: list[float] = []
    waited: dict[int, float] = {}
    for readies in by_step:
        ready_s, rank, _ = readies[-1]
        margin_s = ready_s - (median([r for r, _, _ in readies[:-1]]) or 0.0)
        if margin_s >= STALL_MARGIN_STEPS * step_s:
            stalled[rank] = stalled.get(rank, 0) + 1
            continue
        if margin_s >= line_s:
            slowest[rank] = slowest.get(rank, 0) + 1
            for other_s, other, _ in readies[:-1]:
                waited[other] = waited.get(other, 0.0) + ready_s - other_s
        waits.append(margin_s if margin_s >= line_s else 0.0)
    if not waits:
        return None
    return SlowestRanks(
        steps=len(waits), slowest=slowest, waited_s=sum(waits) / len(waits), waited_se_s=standard_error(waits),
        line_s=line_s, step_s=step_s, stalled=stalled,
        waited_by_rank={rank: total / len(waits) for rank, total in waited.items()}, input_driven=driven,
        by_work=by_work,
    )  # fmt: skip


# Per rank, its kept steps by number: (ready seconds, forward seconds or -1, input elements or -1).
TimedSteps = dict[int, dict[int, tuple[float, float, int]]]


def _timed_steps(ranks: Sequence[tuple[int, Sequence[Window]]], by_work: bool = False) -> TimedSteps | None:
    """Each rank's kept steps, newest first until its share of ``MAX_COMPARED_ENTRIES``; None under two ranks.

    ``by_work``: each step's own work stands for its readiness (no forward, no input size: see the module).
    """
    if by_work:
        timed = [(rank, windows) for rank, windows in ranks if any(w.work_s for w in windows)]
    else:
        timed = [(rank, windows) for rank, windows in ranks if any(w.ready_s for w in windows)]
    if len(timed) < 2:
        return None
    per_rank = max(MAX_COMPARED_ENTRIES // len(timed), MIN_COMPARED_STEPS)
    out: TimedSteps = {}
    for rank, windows in timed:
        steps = out.setdefault(rank, {})
        for w in reversed(windows):  # newest first, until this rank's share of the budget is spent
            if by_work:
                for number, work in zip(w.work_step_numbers, w.work_s, strict=True):
                    steps.setdefault(number, (work, -1.0, -1))
            else:
                for number, ready, forward, numel in ready_steps(w):
                    steps.setdefault(number, (ready, forward, numel))
            if len(steps) >= per_rank:
                break
    return out


def input_driven(timed: TimedSteps) -> float | None:
    """The median over ranks of how closely a rank's forward lengths follow its inputs' sizes (Spearman), when
    at least half the ranks' do by ``INPUT_DRIVEN_MIN_CORRELATION`` and their sizes vary; else None."""
    correlations = []
    for steps in timed.values():
        pairs = [(numel, forward) for _, forward, numel in steps.values() if forward >= 0 and numel >= 0]
        if len(pairs) < MIN_NOISE_STEPS:
            continue
        sizes = sorted(numel for numel, _ in pairs)
        middle = sizes[len(sizes) // 2]
        spread = sizes[(3 * len(sizes)) // 4] - sizes[len(sizes) // 4]
        if middle > 0 and spread >= INPUT_VARIES_MIN_FRAC * middle:
            correlations.append(rank_correlation([n for n, _ in pairs], [f for _, f in pairs]))
        else:
            correlations.append(0.0)
    driven = [c for c in correlations if c >= INPUT_DRIVEN_MIN_CORRELATION]
    if not correlations or 2 * len(driven) < len(correlations):
        return None
    return median(correlations)


def rank_correlation(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rank correlation of two equally long series (ties share their mean rank); 0 when one is flat."""
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    return cov / (vx * vy) ** 0.5 if vx > 0 and vy > 0 else 0.0


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def _by_step(timed: TimedSteps, at_backward_end: bool) -> list[list[tuple[float, int, float]]]:
    """Per step that at least two ranks and half of them timed: (readiness, rank, what came before its forward),
    readiest first.  Readiness is the forward's end, or with ``at_backward_end`` the backward's (see the module)."""
    by_step: dict[int, list[tuple[float, int, float]]] = {}
    for rank, steps in timed.items():
        for number, (ready, forward, _) in steps.items():
            if at_backward_end and forward >= 0:
                entry = (ready + BACKWARD_PER_FORWARD * forward, rank, ready - forward)
            else:
                entry = (ready, rank, ready)
            by_step.setdefault(number, []).append(entry)
    # A step only some ranks timed (one kept a coarser stride, a window was lost) compares too few.
    enough = max(2, (len(timed) + 1) // 2)
    return [sorted(readies) for readies in by_step.values() if len(readies) >= enough]


def _from_the_median(by_step: list[list[tuple[float, int, float]]]) -> list[list[tuple[float, int, float]]]:
    """Each step's own work as the distance from that step's median rank: what the ranks share leaves the noise.

    A step's own work varies with everything its ranks share (a busy machine slows every rank's compute alike, a
    larger batch for all): on 2 shared cores an FSDP2 rank's work varied by a quarter of its median from step to
    step, which read as noise put the line past any straggler (70-125 ms against a 22-ms one).  Which rank the
    others waited for, and by how much, is the same from the median; the noise is then what differs between
    ranks (issue #45: 7-10 ms between two healthy FSDP2 ranks there).
    """
    out = []
    for readies in by_step:
        middle = median([value for value, _, _ in readies]) or 0.0
        out.append([(value - middle, rank, before - middle) for value, rank, before in readies])
    return out


def _noise_s(by_step: Sequence[Sequence[tuple[float, int, float]]]) -> float:
    """How much a rank's readiness varies from step to step when no extra work makes it the latest.

    The interquartile range of each rank's ready times (up to its forward's start where readiness is read at the
    backward's end: the forward's length is then the work, not noise) over the steps in which another rank was
    later, the median over ranks: jitter (a descheduled thread, a batch a little slower) without the rank's own
    slow steps, so a rotation's slow steps stand out from it and a healthy job's jitter does not.
    """
    readier: dict[int, list[float]] = {}
    for readies in by_step:
        for _, rank, before_s in readies[:-1]:
            readier.setdefault(rank, []).append(before_s)
    spreads = []
    for values in readier.values():
        if len(values) >= MIN_NOISE_STEPS:
            values.sort()
            spreads.append(values[(3 * len(values)) // 4] - values[len(values) // 4])
    return median(spreads) or 0.0
