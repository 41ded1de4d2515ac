"""How each figure of a ``Window`` combines over windows, and the phases a step is made of: declared once.

A window is what one rank did in half a second.  Longer spans combine windows
field by field: a recording merges old windows into long ones
(``merge_windows``), the dashboard sums a 10-s span per rank
(``gputop.model.sums``), a rank logs its last 10 s to its trainer's logger
(``gputop.reporter.trainer_figures``).  Each field has one rule, in
``COMBINE``, and all three follow it:

- **total**: counts, and seconds summed over the window's steps, add up;
- **step mean**: a figure of the window's own steps (a quantile) is a mean
  weighted by the steps each window holds;
- **DDP mean**: DDP's per-iteration timings are a mean weighted by the
  iterations each window averaged (``ddp_steps``);
- **time mean**: a rate over the window (CPU %) is a mean weighted by duration;
- **newest**: a reading or a running count is the newest window's that has one;
- **peak**: the largest.

``PHASES`` is the one list of what a step is made of, in the order the phase
bar draws them; the model, the table, the detail screen, the report, the
exporter, the trainer loggers and the straggler rule all read it.  Pure: the
reporter, the node sampler and the model all import it.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gputop.protocol import COLLECTIVES_KEPT, READY_STEPS_KEPT, SLOW_STEPS_KEPT, CollectiveTimes, Window, joined_digests


class How(enum.Enum):
    TOTAL = "total"
    STEP_MEAN = "step mean"
    DDP_MEAN = "DDP mean"
    TIME_MEAN = "time mean"
    NEWEST = "newest"
    PEAK = "peak"


TOTAL, STEP_MEAN, DDP_MEAN, TIME_MEAN, NEWEST, PEAK = How

COMBINE: dict[str, How] = {
    "steps": TOTAL,
    "step_total": NEWEST,
    "step_time_sum_s": TOTAL,
    "step_time_p50_s": STEP_MEAN,
    "step_time_p95_s": STEP_MEAN,
    "step_time_max_s": PEAK,
    "gpu_step_time_p50_s": STEP_MEAN,
    "loader_wait_s": TOTAL,
    "loader_batches": TOTAL,
    "optimizer_s": TOTAL,
    "flops_sum": TOTAL,
    "flops_time_s": TOTAL,
    "flops_steps": TOTAL,
    "samples": TOTAL,
    "forward_s": DDP_MEAN,
    "backward_s": DDP_MEAN,
    "comm_s": DDP_MEAN,
    "overlap_s": DDP_MEAN,
    "forwards": TOTAL,
    "phases_from": NEWEST,
    "compiles": TOTAL,
    "recompiles": TOTAL,
    "compile_s": TOTAL,
    "graph_breaks": NEWEST,  # a running count
    "ddp_iteration": NEWEST,
    "mem_allocated_bytes": NEWEST,
    "mem_reserved_bytes": NEWEST,
    "mem_peak_bytes": PEAK,
    "mem_total_bytes": NEWEST,
    "alloc_retries": NEWEST,  # running counts
    "ooms": NEWEST,
    "cpu_pct": TIME_MEAN,
    "rss_bytes": NEWEST,
    "threads": NEWEST,
    "workers": NEWEST,
    "workers_cpu_pct": TIME_MEAN,
    "main_cpu_wait_s": TOTAL,
    "cpu_wait_s": TOTAL,
    "cpu_run_s": TOTAL,
    "workers_cpu_wait_s": TOTAL,
    "dropped": NEWEST,  # a running count
    "reporter_cpu_s": TOTAL,
    "hook_s": TOTAL,
    "sent_bytes": TOTAL,
}

# Fields with a rule of their own, in ``merge_windows``: who and when, the sketches (added bucket by
# bucket), the slowest steps (the slowest of all, with their numbers), the steps' readiness and their own
# work (thinned by step number, ``ready_steps_kept``), the collectives (added kind by kind and group by
# group, ``merge_collectives``), and the counts of what the totals and the DDP means cover.
OWN_RULE = frozenset(
    {
        "v",
        "run_id",
        "rank",
        "seq",
        "t0",
        "t1",
        "timed_steps",
        "step_sketch",
        "step_hist",
        "slow_steps",
        "slow_step_numbers",
        "ready_step_numbers",
        "ready_s",
        "ready_forward_s",
        "ready_input_numel",
        "work_step_numbers",
        "work_s",
        "collectives",
        "digests",
        "digest_sites",
        "ddp_steps",
    }
)

# Newest-rule fields a probe fills together: a span reads the group's fields from the newest window
# that probe filled, so memory figures are never mixed from two readings.
NEWEST_GROUPS: tuple[tuple[str, ...], ...] = (
    ("mem_allocated_bytes", "mem_reserved_bytes", "mem_total_bytes", "alloc_retries", "ooms"),
    ("rss_bytes", "threads", "workers"),
)


@dataclass(frozen=True)
class Phase:
    """One part of a step: where its seconds a step come from, and how it is named and drawn."""

    name: str  # the model's, the exporter's label and the straggler's name for it
    seconds: str  # the RankStats figure: seconds a step
    label: str  # in a sentence: "its {label} takes 12% of each step"
    short: str  # in a legend
    theme: str  # the Textual theme variable it is drawn in ("" for a neutral grey)
    # Measured only by some reporters (newer ones, with an optimizer hook): when a rank does not
    # measure it, the bar leaves it out and its time stays in "other", as before it was measured.
    optional: bool = False
    # What to look at when one rank's time in this phase stands out (the straggler's fix), where the
    # phase has no more specific one of its own; "{who}" is that rank.
    slow_fix: str = ""


PHASES: tuple[Phase, ...] = (
    Phase("loader", "loader_wait_s", "loader waits", "load", "error"),
    Phase("forward", "forward_s", "forward pass takes", "fwd", "primary"),
    Phase("backward", "backward_s", "backward pass takes", "bwd", "secondary"),
    Phase(
        "optimizer",
        "optimizer_s",
        "optimizer step takes",
        "opt",
        "success",  # green: in the built-in themes accent is often warning's colour, exposed comm's
        optional=True,
        slow_fix="{who}'s optimizer step takes longer than the others': look for work inside it on that rank only "
        "(a gradient-norm log, an EMA or a clipping pass done on one rank, a hook on its optimizer), or optimizer "
        "state kept on the CPU there.",
    ),
    Phase("exposed_comm", "exposed_comm_s", "exposed communication takes", "comm", "warning"),
    Phase("other", "other_s", "time outside the phases takes", "other", ""),
)
PHASE_NAMES: tuple[str, ...] = tuple(p.name for p in PHASES)
# The phases a rank's own work divides into, for comparing ranks: not the exchange, not the rest.
OWN_PHASES: tuple[Phase, ...] = tuple(p for p in PHASES if p.name not in ("exposed_comm", "other"))
EXPOSED_COMM = next(p for p in PHASES if p.name == "exposed_comm")


def phase_seconds(figures: object) -> dict[str, float | None]:
    """A step split into its phases, seconds a step (None: not measured); an unmeasured optional phase is left out.

    ``figures``: anything with the phases' ``seconds`` attributes (``RankStats``).
    """
    out: dict[str, float | None] = {}
    for phase in PHASES:
        value = getattr(figures, phase.seconds)
        if value is not None or not phase.optional:
            out[phase.name] = value
    return out


def other_seconds(step_s: float | None, parts: dict[str, float | None]) -> float | None:
    """Step time not in any measured phase (``parts`` without "other"); None when a required phase is unmeasured."""
    if step_s is None or any(value is None for value in parts.values()):
        return None
    return max(step_s - sum(value for value in parts.values() if value is not None), 0.0)


def window_phase_seconds(w: Window) -> dict[str, float | None]:
    """A window's own phases (``OWN_PHASES``) and exposed comm, seconds a step: a total over its timed
    steps is divided by them, DDP's per-iteration means are read as they are."""
    out: dict[str, float | None] = {}
    for phase in (*OWN_PHASES, EXPOSED_COMM):
        value = getattr(w, phase.seconds)
        if value is not None and COMBINE.get(phase.seconds) is TOTAL:
            value = value / w.timed if w.timed else None
        if phase.name == "loader" and not w.loader_batches:
            value = None  # no tracked loader
        out[phase.name] = value
    return out


# -- per-window shares -------------------------------------------------------------------


def loader_wait_share(loader_wait_s: float, step_time_s: float, *, tracked: bool) -> float | None:
    """Time blocked in the tracked loader over wall step time, both summed over the same steps."""
    return loader_wait_s / step_time_s if (tracked and step_time_s > 0) else None


def share_of_step(per_step_s: float | None, step_time_mean_s: float | None) -> float | None:
    """A per-step duration as a share of the mean wall step."""
    return per_step_s / step_time_mean_s if (per_step_s is not None and step_time_mean_s) else None


def window_loader_wait_frac(w: Window) -> float | None:
    return loader_wait_share(w.loader_wait_s, w.step_time_sum_s, tracked=w.loader_batches > 0)


def window_exposed_comm_frac(w: Window) -> float | None:
    return share_of_step(w.exposed_comm_s, w.step_time_mean_s)


def count_steps(windows: Sequence[Window]) -> int:
    """Steps made across the windows, robust to windows lost in between.

    Uses the cumulative ``step_total``: last total minus the total before the
    first window.  Equals the sum of ``steps`` when no window went missing.
    """
    if not windows:
        return 0
    first, last = windows[0], windows[-1]
    return max(last.step_total - (first.step_total - first.steps), 0)


def window_step_s(w: Window) -> float | None:
    """One window's step time: its exact p50, else its mean."""
    return w.step_time_p50_s if w.step_time_p50_s is not None else w.step_time_mean_s


# -- combining windows ---------------------------------------------------------------------


def _weighted(ws: Sequence[Window], name: str, weight: Callable[[Window], float]) -> float | None:
    total = mass = 0.0
    for w in ws:
        value = getattr(w, name)
        if value is not None:
            total += value * weight(w)
            mass += weight(w)
    return total / mass if mass else None


def _known(ws: Sequence[Window], name: str) -> list[Any]:
    return [value for w in ws if (value := getattr(w, name)) is not None]


def has_ddp_timings(w: Window) -> bool:
    """The window carries DDP's timings (a sampled iteration), which the DDP means weigh."""
    return w.ddp_iteration is not None or w.forward_s is not None or w.comm_s is not None


def _by_steps(w: Window) -> float:
    return float(w.steps)


def _by_iterations(w: Window) -> float:
    return float(w.ddp_steps or 1)


def _by_duration(w: Window) -> float:
    return w.duration_s


def combined(ws: Sequence[Window], name: str) -> Any:
    """Field ``name`` over ``ws`` (one rank's, oldest first), by its rule in ``COMBINE``."""
    how = COMBINE[name]
    if how is TOTAL:
        known = _known(ws, name)
        return sum(known) if known else None
    if how is STEP_MEAN:
        return _weighted(ws, name, _by_steps)
    if how is DDP_MEAN:
        return _weighted([w for w in ws if has_ddp_timings(w)], name, _by_iterations)
    if how is TIME_MEAN:
        return _weighted(ws, name, _by_duration)
    if how is NEWEST:
        return next((value for w in reversed(ws) if (value := getattr(w, name)) is not None), None)
    known = _known(ws, name)  # PEAK
    return max(known) if known else None


def merge_collectives(groups: Iterable[Sequence[CollectiveTimes]]) -> tuple[CollectiveTimes, ...]:
    """Collectives of several windows (or ranks) added up kind by kind and group by group.

    The busiest ``COLLECTIVES_KEPT`` are kept, in the order of their exposed time, most first:
    the one that held training up the longest leads.  A time is None only where none was measured.
    """
    sums: dict[tuple[str, str], list[Any]] = {}
    for collectives in groups:
        for c in collectives:
            total = sums.setdefault((c.kind, c.group), [0, 0, None, None, None])
            total[0] += c.calls
            total[1] += c.bytes
            if c.busy_s is not None:
                total[2] = (total[2] or 0.0) + c.busy_s
            if c.exposed_s is not None:
                total[3] = (total[3] or 0.0) + c.exposed_s
            if c.ranks is not None:  # one group, one size: whichever window said it
                total[4] = c.ranks
    merged = [CollectiveTimes(kind, group, *t) for (kind, group), t in sums.items()]
    merged.sort(key=lambda c: (-(c.exposed_s or 0.0), -(c.busy_s or 0.0), c.kind, c.group))
    return tuple(merged[:COLLECTIVES_KEPT])


# A step's readiness as a window keeps it: (step number, ready seconds, its last forward's seconds, the elements
# of that forward's input; -1: not timed or not known).
ReadyStep = tuple[int, float, float, int]


def ready_steps_kept(steps: Sequence[ReadyStep]) -> list[ReadyStep]:
    """The steps' readiness (``ReadyStep``) a window keeps, in step order: every one up to
    ``READY_STEPS_KEPT``, else those whose number the smallest power of two that leaves that many divides.

    Chosen by step number alone, so ranks that made the same steps keep the same ones (a rank one
    step over the count keeps a subset of the other's), and the collector can compare them.
    """
    kept = sorted(steps)
    while len(kept) > READY_STEPS_KEPT and len({step[0] for step in kept}) > 1:
        shared = math.gcd(*(step[0] for step in kept))
        stride = 2 * (shared & -shared)  # twice the power of two every number kept so far is a multiple of
        kept = [step for step in kept if step[0] % stride == 0]
    return kept[-READY_STEPS_KEPT:]  # one number many times over (a rank that started over): the last ones


def ready_steps(w: Window) -> list[ReadyStep]:
    """A window's readiness per step, its forwards' times and input sizes -1 where it sent none."""
    forwards = w.ready_forward_s or (-1.0,) * len(w.ready_s)
    sizes = w.ready_input_numel or (-1,) * len(w.ready_s)
    return list(zip(w.ready_step_numbers, w.ready_s, forwards, sizes, strict=True))


def merge_windows(ws: Sequence[Window]) -> Window:
    """One window covering ``ws`` (one rank's, oldest first, at least one): what a reporter would have sent
    had its window been that long.  A recording keeps its size this way.

    The windows' own p50/p95 become step-weighted means of theirs; the sketch keeps
    the exact shape for the quantiles computed from it.
    """
    if len(ws) == 1:
        return ws[0]
    first, last = ws[0], ws[-1]
    hist: Counter[int] = Counter()
    sketch: Counter[int] = Counter()
    for w in ws:
        hist.update(w.step_hist)
        sketch.update(w.step_sketch)
    # Each slow step with its number (0 where an older reporter sent none), the slowest kept.
    numbered = all(len(w.slow_step_numbers) == len(w.slow_steps) for w in ws)
    pairs = [(step, w.slow_step_numbers[i] if numbered else 0) for w in ws for i, step in enumerate(w.slow_steps)]
    slowest = sorted(pairs, key=lambda pair: pair[0], reverse=True)[:SLOW_STEPS_KEPT]
    ready = ready_steps_kept([step for w in ws for step in ready_steps(w)])
    work = ready_steps_kept([(n, s, -1.0, -1) for w in ws for n, s in zip(w.work_step_numbers, w.work_s, strict=True)])
    timed = sum(w.timed for w in ws)
    steps = sum(w.steps for w in ws)
    ddp = [w for w in ws if has_ddp_timings(w)]
    figures = {name: combined(ws, name) for name in COMBINE}
    return Window(
        run_id=last.run_id,
        rank=last.rank,
        seq=last.seq,
        t0=first.t0,
        t1=last.t1,
        timed_steps=timed if timed != steps else None,
        step_sketch=dict(sketch),
        slow_steps=tuple(step for step, _ in slowest),
        slow_step_numbers=tuple(number for _, number in slowest) if numbered else (),
        ready_step_numbers=tuple(step[0] for step in ready),
        ready_s=tuple(step[1] for step in ready),
        # Forwards and their inputs only where every step kept has them (none from a window of an older reporter).
        ready_forward_s=tuple(step[2] for step in ready) if all(step[2] >= 0 for step in ready) else (),
        ready_input_numel=tuple(step[3] for step in ready) if all(step[3] >= 0 for step in ready) else (),
        work_step_numbers=tuple(step[0] for step in work),
        work_s=tuple(step[1] for step in work),
        step_hist=dict(hist),
        collectives=merge_collectives(w.collectives for w in ws),
        **joined_digests(ws),  # type: ignore[arg-type]
        ddp_steps=sum(w.ddp_steps or 1 for w in ddp) if ddp else None,
        **figures,
    )
