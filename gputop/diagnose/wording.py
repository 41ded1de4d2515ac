"""How findings read: rank lists, percentages and device-hours in titles and evidence."""

from __future__ import annotations

from collections.abc import Sequence

# Places in the user's code a title lists (a straggler's, each stuck rank's), the most sampled first; more read "…".
PLACES_NAMED = 3


def ranks_text(ranks: Sequence[int]) -> str:
    """'rank 3', 'ranks 0, 1', 'ranks 0-7' for a title."""
    ordered = sorted(set(ranks))
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    if len(ordered) > 2 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"ranks {ordered[0]}-{ordered[-1]}"
    return "ranks " + ", ".join(str(r) for r in ordered)


RANGES_NAMED = 4  # rank ranges a title spells out before it gives a count: "ranks 17, 345, 800", "4,093 ranks"


def ranks_short(ranks: Sequence[int], ranges_named: int = RANGES_NAMED) -> str:
    """'rank 3', 'ranks 17, 345, 800', 'ranks 0-16, 18-4095', or past ``ranges_named`` ranges '4,093 ranks'."""
    ordered = sorted(set(ranks))
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    ranges: list[tuple[int, int]] = []
    for rank in ordered:
        if ranges and rank == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], rank)
        else:
            ranges.append((rank, rank))
    if len(ranges) > ranges_named:
        return f"{len(ordered):,} ranks"
    return "ranks " + ", ".join(f"{a}" if a == b else f"{a}, {b}" if b == a + 1 else f"{a}-{b}" for a, b in ranges)


def too_close_text(value: float, se: float | None, line: float, steps: int) -> str:
    """'9 ± 2% over 40 steps, too close to the 10% line to call' for a share whose band straddles a line.

    Without a band (fewer than 3 windows): '20% over 5 steps, too few windows yet to call against the 10% line'.
    """
    if se is None:
        return f"{pct(value):.0f}% over {steps} steps, too few windows yet to call against the {pct(line):.0f}% line"
    return f"{pct(value):.0f} ± {pct(2 * se):.0f}% over {steps} steps, too close to the {pct(line):.0f}% line to call"


def pct(frac: float) -> float:
    """A fraction as a percentage, for evidence and titles."""
    return frac * 100.0


def hours_text(hours: float) -> str:
    """Device-hours in two figures, never in exponent form: 0.49, 2.3, 120."""
    return f"{hours:.2g}" if hours < 100 else f"{hours:,.0f}"
