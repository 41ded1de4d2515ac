"""Where the ranks' collective digests first differ on a group: what the desync rule reads after a backend went on
through it (gputop/collect/digests.py keeps the book; gputop/reporter/collective_digests.py makes the digests)."""

from __future__ import annotations

from dataclasses import dataclass

from gputop.protocol import DigestSite


@dataclass(frozen=True)
class DigestSide:
    """The ranks whose digest at the number is one value, and what it stands for (None: not said yet)."""

    ranks: tuple[int, ...]
    digest: int
    call: DigestSite | None


@dataclass(frozen=True)
class DigestMismatch:
    """The first collective number on a group at which the ranks' digests differ."""

    group: str
    number: int
    sides: tuple[DigestSide, ...]  # most ranks first
    numbers_differing: int  # numbers on the group whose digests have differed, this one included

    @property
    def site_only(self) -> bool:
        """The same kind, dtype and size on every side, from different places: the exchange itself agrees."""
        calls = [side.call for side in self.sides]
        if any(call is None for call in calls):
            return False
        shapes = {(c.kind, c.dtype, c.bytes) for c in calls if c is not None}
        return len(shapes) == 1
