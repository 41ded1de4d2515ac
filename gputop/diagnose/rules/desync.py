"""desync: ranks whose collective number N on a process group is not the same call: another kind, another size.

torch numbers each group's collectives alike on every rank, so collective #N is one exchange: every rank must
issue the same kind with the same size there.  A rank-conditional ``all_reduce`` (a metric logged on rank 0 only),
a tensor of another shape on one rank, or collectives issued in another order make the ranks' #N different calls;
the backend then hangs (gloo, NCCL), raises, or goes on with garbage.  ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` checks this
at a cost nobody pays in production; here it is read from what the reporters send while a rank is stuck (the stacks'
``groups``), as soon as two ranks have said what their #N is, with each side's call site (its stack sample).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from gputop.diagnose.details import DesyncDetails, DesyncSide
from gputop.diagnose.findings import Evidence, Finding
from gputop.diagnose.rules.collective_positions import (
    DDP_ALL_REDUCE,
    Position,
    positions,
    stopped_from_outside,
)
from gputop.diagnose.wording import ranks_short
from gputop.model.collectives import InCollective
from gputop.model.digests import DigestMismatch
from gputop.model.figures import RunFigures
from gputop.model.frames import span_frames
from gputop.model.snapshot import LIVE

# Kinds whose size must be the same on every rank; all_to_all, gather, scatter and point-to-point may differ, and
# a barrier has none.
SAME_SIZE_KINDS = frozenset({"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"})


def desync_findings(run: RunFigures, *, hung: bool) -> list[Finding]:
    """One critical finding for the run's first numbered collective whose ranks issued different calls.

    ``hung``: the hang rule holds the run hung.  Only then is a rank in DDP's backward taken to be in DDP's
    all-reduce: in a job of long steps the numbers come every second while it steps, and a rank still computing
    its backward, its all-reduce not issued, would read as in the collective its count names.
    """
    ranks = [r for r in run.ranks if r.status == LIVE or stopped_from_outside(r)]  # a run ended desynced is one
    frames = {r.rank: f for r in ranks if (f := span_frames(r)) is not None}
    by_key: dict[tuple[str, int], list[Position]] = {}
    for position in positions(ranks, frames).values():  # measure
        if position.inside is not None and (hung or position.inside.kind != DDP_ALL_REDUCE):
            by_key.setdefault(position.inside.key, []).append(position)
    for (group, number), found in sorted(by_key.items(), key=lambda item: item[0][1]):
        sides = desync_sides(found)  # decide
        if len(sides) > 1:
            return [desync_finding(run.run_id, group, number, sides)]
    for mismatch in run.snapshot.desyncs:  # from the digests: also where the backend went on through it
        return [digest_desync_finding(run.run_id, mismatch)]
    return []


def digest_desync_finding(run_id: str, mismatch: DigestMismatch) -> Finding:
    """The first number whose digests differ: critical where the calls differ (kind, dtype or size), warn where
    only the call site does (the exchange agrees; the code paths do not, which the next change may break)."""
    sides = tuple(
        DesyncSide(
            side.ranks,
            side.call.kind,
            side.call.bytes if side.call.kind in SAME_SIZE_KINDS else None,
            side.call.site,
            side.call.dtype,
        )
        if side.call is not None
        else DesyncSide(side.ranks, "a collective not described yet", None, "")
        for side in mismatch.sides
    )
    after = mismatch.numbers_differing - 1
    more = f" ({after} later {'one differs' if after == 1 else 'ones differ'} too)" if after > 0 else ""
    finding = desync_finding(run_id, mismatch.group, mismatch.number, sides)
    if not mismatch.site_only:
        return replace(finding, title=finding.title + more)
    call = mismatch.sides[0].call
    assert call is not None  # site_only: every side described
    places = "; ".join(f"{ranks_short(side.ranks, 2)} from {side.site}" for side in sides)
    title = (f"collective #{mismatch.number} on {mismatch.group} is the same {sides[0].call_text()} on every rank, "
             f"issued from different places: {places}{more}")  # fmt: skip
    return replace(finding, severity="warn", title=title, suggestion=SITE_ONLY_SUGGESTION)


def desync_sides(found: list[Position]) -> tuple[DesyncSide, ...]:
    """The ranks at one number grouped by the call they issued there, most ranks first."""
    calls: dict[tuple[str, int | None], list[Position]] = {}
    for position in found:
        inside: InCollective | None = position.inside
        if inside is not None:
            size = inside.bytes if inside.kind in SAME_SIZE_KINDS else None
            calls.setdefault((inside.kind, size), []).append(position)
    sides = []
    for (kind, size), there in calls.items():
        sites = Counter(p.frame.place for p in there if p.frame is not None and p.frame.file)
        site = sites.most_common(1)[0][0] if sites else ""
        sides.append(DesyncSide(tuple(sorted(p.rank for p in there)), kind, size, site))
    return tuple(sorted(sides, key=lambda side: (-len(side.ranks), side.ranks)))


def desync_finding(run_id: str, group: str, number: int, sides: tuple[DesyncSide, ...]) -> Finding:
    """'collective #21 on world is not the same call on every rank: rank 0 all_reduce of 4 B from ...; rank 1 ...'."""
    ranks = tuple(sorted(r for side in sides for r in side.ranks))
    return Finding(
        cause="desync",
        severity="critical",
        title=f"collective #{number} on {group} is not the same call on every rank: "
        + "; ".join(side.text() for side in sides),
        suggestion=DESYNC_SUGGESTION,
        evidence=(Evidence("calls_at_one_number", float(len(sides)), 1.0, op=">"),),
        ranks=ranks,
        run_id=run_id,
        magnitude=1.0,
        details=DesyncDetails(group, number, sides),
    )


SITE_ONLY_SUGGESTION = (
    "The ranks agree on the exchange but reach it from different lines: a branch on the rank that happens to issue "
    "the same collective on both paths. It works until one path changes; issue the collective from one place."
)
DESYNC_SUGGESTION = (
    "Every rank of a process group must issue the same collectives, of the same size, in the same order. Look at "
    "both call sites: a collective inside a branch on the rank (a metric all-reduced on rank 0 only), a tensor "
    "whose shape differs across ranks, or collectives issued in a different order. TORCH_DISTRIBUTED_DEBUG=DETAIL "
    "checks each collective's shape, at a cost, to confirm it."
)
