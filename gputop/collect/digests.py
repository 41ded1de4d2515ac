"""One run's collective digests, compared across ranks number by number as the windows arrive (issue #55).

Each rank sends, per process group, a 16-bit digest of every collective it issued through the tap, by number
(gputop/reporter/collective_digests.py).  Collective #N on a group is one exchange, so every rank's digest at N
must be the same; where two differ, the ranks issued different calls there: another kind, dtype or size (a
desync the backend may go on through, summing float32 with int32), or the same call from another place.  The
book keeps each group's newest ``KEPT`` numbers, and the first number at which the ranks differ (what the desync
finding names), with how many numbers have differed since.  Pure bookkeeping under the store's lock.
"""

from __future__ import annotations

from gputop.model.digests import DigestMismatch, DigestSide
from gputop.protocol import DigestSite, Window

KEPT = 8192  # numbers kept per group: several seconds of a job's collectives, for a late rank's windows to meet


class DigestBook:
    """One run's digests: ``add`` each window; ``mismatches()`` for a snapshot."""

    def __init__(self) -> None:
        self._numbers: dict[str, dict[int, dict[int, int]]] = {}  # group -> number -> rank -> digest
        self._calls: dict[int, dict[int, DigestSite]] = {}  # rank -> digest -> what it stands for
        self._first: dict[str, tuple[int, dict[int, int]]] = {}  # group -> (number, rank -> digest) first differing
        self._differing: dict[str, set[int]] = {}  # group -> numbers seen differing (bounded like the numbers)

    def add(self, rank: int, window: Window) -> None:
        if window.digest_sites:
            calls = self._calls.setdefault(rank, {})
            for call in window.digest_sites:
                calls[call.digest] = call
        for sent in window.digests:
            numbers = self._numbers.setdefault(sent.group, {})
            for number, digest in sent.digests():
                at = numbers.get(number)
                if at is None:
                    numbers[number] = {rank: digest}
                    if len(numbers) > KEPT:
                        del numbers[next(iter(numbers))]  # the oldest kept (numbers arrive nearly in order)
                    continue
                at[rank] = digest
                if len(at) > 1 and any(other != digest for other in at.values()):
                    self._differs(sent.group, number, at)

    def _differs(self, group: str, number: int, at: dict[int, int]) -> None:
        differing = self._differing.setdefault(group, set())
        if len(differing) < KEPT:
            differing.add(number)
        first = self._first.get(group)
        if first is None or number < first[0]:
            self._first[group] = (number, at)  # the same dict: ranks that say their digest later are in it

    def mismatches(self) -> tuple[DigestMismatch, ...]:
        """Each group's first differing number, with its sides; lowest number first."""
        found = []
        for group, (number, at) in self._first.items():
            by_digest: dict[int, list[int]] = {}
            for rank, digest in sorted(at.items()):
                by_digest.setdefault(digest, []).append(rank)
            sides = tuple(
                sorted(
                    (
                        DigestSide(tuple(ranks), digest, self._call(ranks, digest))
                        for digest, ranks in by_digest.items()
                    ),
                    key=lambda side: (-len(side.ranks), side.ranks),
                )
            )
            found.append(DigestMismatch(group, number, sides, len(self._differing.get(group, ()))))
        return tuple(sorted(found, key=lambda m: m.number))

    def _call(self, ranks: list[int], digest: int) -> DigestSite | None:
        for rank in ranks:
            call = self._calls.get(rank, {}).get(digest)
            if call is not None:
                return call
        return None
