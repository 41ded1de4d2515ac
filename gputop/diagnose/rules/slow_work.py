"""Where a slow rank's extra time goes: the phase that holds it, the user's code the samples find it in,
and work outside the model that the others' own slowness hides.

The straggler rule (``rules.straggler``) decides that a rank is slow and by how
much; these say where, in the words its title uses: "it takes 29% more of each
step than the others, in its backward pass", "38% of each step in
`compute_metrics` (train.py:57), after the optimizer step".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gputop.combine import OWN_PHASES
from gputop.diagnose.thresholds import STRAGGLER_WAIT_WARN_FRAC
from gputop.diagnose.wording import PLACES_NAMED, pct
from gputop.model.figures import RankFigures, stat_reader
from gputop.model.frames import FrameShare, RankFrames, span_frames
from gputop.model.statistics import leave_one_out_medians, median
from gputop.protocol import MAX_STACKS_TOP

# The phases a slow rank can lose time in (gputop.combine.OWN_PHASES, and "other", the rest of its step);
# "own" is its own time as a whole, when no one phase holds the excess.
SlowPhaseName = str


PHASES: dict[SlowPhaseName, Callable[[RankFigures], float | None]] = {
    **{p.name: stat_reader(p.seconds) for p in OWN_PHASES},
    "other": lambda r: r.stats.phases.other_s,
}


# Where a slow rank's excess lies, after "it takes N% more of each step than the others, ".
PHASE_WHERE: dict[SlowPhaseName, str] = {
    **{p.name: "in its " + p.label.removesuffix(" takes") for p in OWN_PHASES},
    "loader": "waiting for its data",
    "other": "outside {phases} and comm",
    "own": "spread over its phases, in no one of them",
}


def phase_text(rank: RankFigures, phase: SlowPhase) -> str:
    """The excess first, then where it lies: "it takes 29% more of each step than the others, in its backward pass".

    "outside" lists the phases the rank measures (an unmeasured optimizer's time is in it).
    """
    measured = [p.name for p in OWN_PHASES if not p.optional or getattr(rank.stats.phases, p.seconds) is not None]
    excess = pct(phase.excess_s / (rank.stats.step.mean_s or 1e-9))
    where = PHASE_WHERE[phase.name].format(phases=", ".join(measured))
    return f"it takes {excess:.0f}% more of each step than the others, {where}"


# Where the samples put a slow rank's time outside the phases is named when they find there, beyond what
# they find of the others' there, at least this part of what its measured outside time exceeds theirs by.
# Two estimates of one quantity: the samples undercount pure Python (the GIL hands them over at its
# switch points), 0.6-0.9 of the measured time in the benchmark's metric case; a rank descheduled
# between phases shows measured time there and no samples at all (0).
STRAGGLER_PLACE_MIN_PART = 0.5


# Places a title lists (PLACES_NAMED, most sampled first), each with at least this part of the first one's samples.
PLACE_MIN_OF_FIRST = 0.2


@dataclass(frozen=True)
class SlowPhase:
    """The phase in which a slow rank loses most time against the others."""

    name: SlowPhaseName
    share: float  # of the slow rank's step time
    excess_s: float  # per step, over the other ranks' median for the same phase


def masked_outside_work(ranks: list[RankFigures]) -> tuple[RankFigures, float] | None:
    """The one rank doing work outside the model that the others do not, while its own time stands out little.

    Every rank runs the same script, so time outside loader, forward, backward
    and comm (metrics, logging, checkpoints) is alike across ranks unless one
    rank does extra work.  When the others' own work is slower too (a neighbour
    takes their CPU, their pages landed worse), it hides that work: the others
    wait for it less than it takes, and its own-time excess stays under the
    line, yet it is still on the step's critical path.  The caller names it
    only where the stacks place that work in the user's code.  Returns the rank with
    its own-time excess, when exactly one rank's outside time exceeds the
    others' median by the line and its own work still takes longer than theirs.
    """
    others_outside = leave_one_out_medians([r.stats.phases.other_s or 0.0 for r in ranks])
    others_own = leave_one_out_medians([r.own_s or 0.0 for r in ranks])
    found: list[tuple[RankFigures, float]] = []
    for rank, outside, own in zip(ranks, others_outside, others_own, strict=True):
        step = rank.stats.step.mean_s
        if rank.stats.phases.other_s is None or outside is None or own is None or not step:
            continue
        if (rank.stats.phases.other_s - outside) / step > STRAGGLER_WAIT_WARN_FRAC and (rank.own_s or 0.0) > own:
            found.append((rank, ((rank.own_s or 0.0) - own) / step))
    return found[0] if len(found) == 1 else None


def masking_text(slow: RankFigures, others: list[RankFigures]) -> str:
    """', less than that work: their own backward pass takes 14 ms more' — why the others wait less than it works."""
    surplus: dict[SlowPhaseName, float] = {}
    for name in (p.name for p in OWN_PHASES):
        mine = PHASES[name](slow)
        typical = median([v for v in (PHASES[name](r) for r in others) if v is not None])
        if mine is not None and typical is not None:
            surplus[name] = typical - mine
    if not surplus or max(surplus.values()) <= 0:
        return ", less than that work: their own work takes longer too"
    name = max(surplus, key=lambda n: surplus[n])
    what = next(p.label for p in OWN_PHASES if p.name == name)
    return (
        f", less than that work: their {what} {surplus[name] * 1e3:.0f} ms more than its, which hides it "
        "(it will cost more once they are faster)"
    )


@dataclass(frozen=True)
class Place:
    """Where the samples put a slow rank's time outside the phases: its places in the user's code."""

    places: tuple[FrameShare, ...]  # most sampled first

    def where(self) -> str:
        """The most sampled place: "in `compute_metrics` (train.py:57), after the optimizer step"."""
        return self.places[0].frame.text()

    def text(self) -> str:
        """ "38% of each step in `compute_metrics` (train.py:57), after the optimizer step", or several places.

        The few places that hold most of it: a stray sample elsewhere is not a place.
        """
        first = self.places[0].share
        named = [p for p in self.places[:PLACES_NAMED] if p.share >= PLACE_MIN_OF_FIRST * first]
        head = f"{pct(sum(p.share for p in named)):.0f}% of each step"
        if len(named) == 1:
            return f"{head} {named[0].frame.text()}"
        wheres = {p.frame.where for p in named}
        if len(wheres) == 1:
            return f"{head} {named[0].frame.where_text}: " + ", ".join(
                f"{pct(p.share):.0f}% in {p.frame.place}" for p in named
            )
        return f"{head} outside the model: " + ", ".join(p.text() for p in named)


def straggler_place(phase: SlowPhase, slow: RankFigures, others: list[RankFigures]) -> Place | None:
    """For time outside the phases: the user's code the samples find it in, when they find enough of it there.

    The amount is the measured one (``phase.excess_s``); the samples only say
    where it goes.  A place is named when this rank's samples find its
    outside places, beyond the others' samples there, in at least
    ``STRAGGLER_PLACE_MIN_PART`` of that amount.  No one place is asked to
    hold it: a sample names the innermost function of the user's code, so a
    metric's time splits between ``Metric.update``, a generator expression in
    it and the loop that calls it, each a part of the same work.  So every
    place the stacks messages named counts, not only the few a screen shows.
    """
    if phase.name not in ("other", "own"):
        return None
    frames = span_frames(slow, top=MAX_STACKS_TOP)
    places = () if frames is None else frames.outside_phases()
    if not places:
        return None
    theirs = median([outside_share(span_frames(r, top=MAX_STACKS_TOP)) for r in others])
    amount = phase.excess_s / (slow.stats.step.mean_s or 1e-9)
    if outside_share(frames) - (theirs or 0.0) < STRAGGLER_PLACE_MIN_PART * amount:
        return None
    return Place(places)


def outside_share(frames: RankFrames | None) -> float:
    """The share of a rank's samples in the user's code outside the phases (0 when it sends no stacks)."""
    return 0.0 if frames is None else sum(p.share for p in frames.outside_phases())


# A phase is named as where a slow rank's time goes when its measured excess is at least this part of the
# rank's whole own-time excess; else the excess is spread over phases, or lies where none is measured.
SLOW_PHASE_MIN_PART = 0.5


def slow_phase(slow: RankFigures, others: list[RankFigures]) -> tuple[SlowPhase, float]:
    """The phase where the slow rank spends most time beyond the others' median, when it holds most of the excess.

    Returns it with the others' median share of step time in that same phase.
    A phase is named only from its own measured time, never because the others
    are not: a forward pass 0.3 ms longer is not where a 20-ms excess went.
    """
    step = slow.stats.step.mean_s or 1e-9
    own = slow.own_s or 0.0
    typical_own = median([r.own_s or 0.0 for r in others]) or 0.0
    best: SlowPhase | None = None
    best_typical = 0.0
    for name, read in PHASES.items():
        mine = read(slow)
        typical = median([v for v in (read(r) for r in others) if v is not None])
        if mine is None or typical is None:
            continue
        excess = mine - typical
        if best is None or excess > best.excess_s:
            best, best_typical = SlowPhase(name, mine / step, excess), typical
    if best is None or best.excess_s <= 0 or best.excess_s < SLOW_PHASE_MIN_PART * (own - typical_own):
        return SlowPhase("own", own / step, own - typical_own), typical_own / step
    return best, best_typical / step


def slow_place(slow: RankFigures, others: list[RankFigures]) -> tuple[SlowPhase, float, Place | None]:
    """Where a slow rank's excess lies, decided once for its title and its fix: the phase (``slow_phase``), the
    others' median share in it, and the place in the user's code the samples find the excess in.

    When no one phase holds the excess ("own") but the samples find it in the user's code outside the phases
    (``straggler_place``), it lies there: work outside the model, said as such, with that place; "the same
    work takes longer" is left for an excess the samples do not place.
    """
    phase, others_share = slow_phase(slow, others)
    place = straggler_place(phase, slow, others)
    if phase.name == "own" and place is not None:
        step = slow.stats.step.mean_s or 1e-9
        typical = median([r.stats.phases.other_s for r in others if r.stats.phases.other_s is not None]) or 0.0
        phase = SlowPhase("other", (slow.stats.phases.other_s or 0.0) / step, phase.excess_s)
        others_share = typical / step
    return phase, others_share, place
