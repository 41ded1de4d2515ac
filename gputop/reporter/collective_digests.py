"""Each collective's digest: what a desync the backend goes on through is read from (issue #55).

torch numbers each group's collectives alike on every rank (``_get_sequence_number_for_group``): collective #N
on a group is one exchange, which every rank must issue as the same call.  Two ranks that all-reduce 16 bytes
there, float32 on one and int32 on the other, are summed by gloo and NCCL alike: the job finishes with a wrong
number.  So, while a collector listens, each collective issued through the tap leaves its number (torch's, read
before the call: the next) and a 16-bit digest in its group's log; the reporter thread sends them in each window
(``GroupDigests``), and the collector compares them across ranks number by number (gputop/collect/digests.py).
The numbers are torch's, the ones a hang names, so a rank that connected later still meets the others at them.

What a digest covers, and why so: every collective's digest is its call's shape, (kind, dtype, size): a dict
lookup by size and an identity check of the dtype on the training thread.  The call site is folded in at every
``SITED``-th number only, on every rank alike: reading the caller's frame costs more than the rest together
(~0.3 µs on a 2-vCPU VM), and the same call from two places is the lesser desync.  One issued every step is met at
a sited number within a few steps (17 is prime: the sited position moves through a step's collectives).  A
digest's call, and the place it was first issued from, are sent once (``DigestSite``) for the finding's words.
docs/performance.md has what it costs.  A digest equal on two ranks may hide a difference (one in 65,536); a
digest that differs never lies.
"""

from __future__ import annotations

import os
import sys
import zlib
from array import array
from collections import deque
from types import FrameType
from typing import Any

from gputop.protocol import MAX_DIGESTS_SENT, DigestSite, GroupDigests

LOG_KEPT = 4096  # each group's newest (number, digest) pairs kept until the reporter thread sends them
# Kinds whose size must be the same on every rank (their digest covers it), and kinds not digested at all.
SIZED = frozenset({"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"})
POINT_TO_POINT = frozenset({"send", "recv"})
SITED = 17  # every SITED-th collective number on a group has its call site in its digest
SITES_KEPT = 4096  # call sites remembered; past it the table starts again (digests are worked out anew)
SHAPES_KEPT = 1024  # a wrapper's call shapes remembered, the same way
NEW_KEPT = 256  # new (digest, call) pairs not sent yet


def new_log() -> deque[tuple[int, int]]:
    return deque(maxlen=LOG_KEPT)


class SiteDigests:
    """Digests of calls' shapes and of calls with their sites, and the calls not yet described to the collector.

    ``shape`` and ``sited`` run on the training thread, the first time a shape (or a site) is seen; the tap keeps
    its own per-wrapper table of shapes already seen (``collectives.CollectiveTap._wrap``)."""

    def __init__(self) -> None:
        # site key (code identity, instruction offset) -> (dtype, bytes, kind, digest) last issued there
        self._sites: dict[int, tuple[Any, int, str, int]] = {}
        self.new: deque[DigestSite] = deque(maxlen=NEW_KEPT)
        self._said: set[int] = set()  # digests whose call was queued in ``new`` once

    def shape(self, frame: FrameType, kind: str, dtype: Any, nbytes: int) -> int:
        """The digest of a call's shape; ``frame`` (its caller's) names where it was first issued from."""
        dtype_text = _dtype_text(dtype)
        digest = zlib.crc32(f"{kind}|{dtype_text}|{nbytes}".encode()) & 0xFFFF
        self._describe(digest, kind, dtype_text, nbytes, frame)
        return digest

    def sited(self, frame: FrameType, kind: str, dtype: Any, nbytes: int) -> int:
        """The digest of a call's shape and site (at a ``SITED`` number); its frame read each time."""
        key = id(frame.f_code) ^ frame.f_lasti << 48
        seen = self._sites.get(key)
        if seen is not None and seen[0] is dtype and seen[1] == nbytes and seen[2] is kind:
            return seen[3]
        dtype_text = _dtype_text(dtype)
        site = _site(frame)
        digest = zlib.crc32(f"{kind}|{dtype_text}|{nbytes}|{site}".encode()) & 0xFFFF
        if len(self._sites) >= SITES_KEPT:
            self._sites.clear()
        self._sites[key] = (dtype, nbytes, kind, digest)
        self._describe(digest, kind, dtype_text, nbytes, frame, site)
        return digest

    def _describe(self, digest: int, kind: str, dtype: str, nbytes: int, frame: FrameType, site: str = "") -> None:
        if digest not in self._said:
            self._said.add(digest)
            self.new.append(DigestSite(kind, dtype, nbytes, (site or _site(frame))[:200], digest))


def record(counts: Any, sites: SiteDigests, shapes: dict[int, tuple[Any, int]], kind: str, dtype: Any, nbytes: int,
           depth: int) -> int | None:  # fmt: skip
    """A collective's number and digest in its group's log, and the number; training thread, in the tap's wrapper
    while a collector listens, ``depth`` frames below the caller of the collective (whose frame is read only at a
    sited number or a shape seen for the first time).  The number is torch's count before the call, and one:
    ~0.25 µs to read; None where torch does not number the group, or the collective is a send or a receive."""
    if kind in POINT_TO_POINT:  # a send meets a recv by design
        return None
    if kind not in SIZED:  # all_to_all, gather, scatter: the sizes may differ across ranks by design
        nbytes = 0
    try:
        number: int = counts.sequence() + 1
    except Exception:  # a group torch does not number (another backend, a stand-in): no digest
        return None
    if number % SITED:
        seen = shapes.get(nbytes)
        if seen is None or seen[0] is not dtype:
            if len(shapes) >= SHAPES_KEPT:
                shapes.clear()
            seen = shapes[nbytes] = (dtype, sites.shape(sys._getframe(depth), kind, dtype, nbytes))
        counts.digests.append((number, seen[1]))
    else:
        counts.digests.append((number, sites.sited(sys._getframe(depth), kind, dtype, nbytes)))
    return number


def _dtype_text(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.") if dtype is not None else ""


def _site(frame: FrameType) -> str:
    code = frame.f_code
    return f"`{code.co_name}` ({os.path.basename(code.co_filename)}:{frame.f_lineno})"


def take_digests(log: deque[tuple[int, int]], group: str) -> GroupDigests | None:
    """The (number, digest) pairs logged since the last window, oldest first; reporter thread (the training thread
    appends meanwhile: pairs are taken one at a time, each whole)."""
    taken = []
    for _ in range(min(len(log), MAX_DIGESTS_SENT)):
        try:
            taken.append(log.popleft())
        except IndexError:
            break
    if not taken:
        return None
    values = array("H", (digest for _, digest in taken))
    if sys.byteorder == "little":
        values.byteswap()
    return GroupDigests(group, tuple(number for number, _ in taken), values.tobytes())
