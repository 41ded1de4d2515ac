"""A rank's collectives over a span: each kind on each process group, a step's worth (pure).

The windows carry totals (``Window.collectives``, from the reporter's collective tap or DDP's
logger); a span adds them up kind by kind and group by group and divides by the steps of the
windows that carry them.  The communication finding, the rank detail screen, the report, the
exporter and ``gputop mcp`` read these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from gputop.combine import merge_collectives
from gputop.protocol import Window


class CollectiveFigures(msgspec.Struct, frozen=True, gc=False):
    """One kind of collective on one process group, per step of the span (times None: not measured)."""

    kind: str  # "all_gather", "reduce_scatter", "all_reduce", …
    group: str  # the DeviceMesh dimension ("dp", "tp"), "world", or "pg N"
    calls: float  # a step
    bytes: float  # a step, what the rank sent in
    busy_s: float | None  # a step, issue to completion
    exposed_s: float | None  # a step, the training thread blocked on it
    ranks: int | None = None  # the group's size (None: not said, a recording from before it was)

    @property
    def name(self) -> str:
        """``all_gather on dp``: how the findings and the screens name it."""
        return f"{self.kind} on {self.group}"

    @property
    def bytes_each(self) -> float:
        return self.bytes / self.calls if self.calls else 0.0

    @property
    def bandwidth(self) -> tuple[float, float] | None:
        """(algorithm, bus) bandwidth of one call, bytes/s, from its time in flight (``bandwidth``)."""
        if self.busy_s is None or not self.calls:
            return None
        return bandwidth(self.kind, self.bytes_each, self.busy_s / self.calls, self.ranks)

    def to_dict(self) -> dict[str, Any]:
        """The report's and ``gputop mcp``'s entry: a step's calls, bytes and milliseconds (None: N/A), and each
        call's bus bandwidth (bytes/s)."""
        bandwidth = self.bandwidth
        return {
            "kind": self.kind,
            "group": self.group,
            "calls_per_step": round(self.calls, 2),
            "bytes_per_step": round(self.bytes),
            "in_flight_ms": None if self.busy_s is None else round(self.busy_s * 1e3, 3),
            "exposed_ms": None if self.exposed_s is None else round(self.exposed_s * 1e3, 3),
            "ranks": self.ranks,
            "bus_bytes_per_s": None if bandwidth is None else round(bandwidth[1]),
        }


# nccl-tests' bus bandwidth (its doc/PERFORMANCE.md): a call moving its size S in t has algorithm bandwidth S / t, and
# bus bandwidth S / t times a factor of the kind and the group's size n, the share of S each link carries, so that
# one figure compares with the link's own speed whatever the kind and however many ranks.  S is nccl-tests' size:
# an all-gather's whole output, n times what one rank sends; the tensor the rank sends for every other kind.
_BUS_FACTOR: dict[str, tuple[int, Any]] = {  # kind: (S in shards the rank sent, factor of n)
    "all_reduce": (0, lambda n: 2 * (n - 1) / n),
    "all_gather": (1, lambda n: (n - 1) / n),
    "reduce_scatter": (0, lambda n: (n - 1) / n),
    "all_to_all": (0, lambda n: (n - 1) / n),
    "broadcast": (0, lambda n: 1.0),
    "reduce": (0, lambda n: 1.0),
    "send": (0, lambda n: 1.0),
    "recv": (0, lambda n: 1.0),
}


def bandwidth(kind: str, sent: float, seconds: float, ranks: int | None) -> tuple[float, float] | None:
    """(algorithm, bus) bandwidth in bytes/s of one ``kind`` call in which the rank sent ``sent`` bytes and which
    was in flight ``seconds``, in a group of ``ranks``; None where it cannot be said (a barrier, no size, no time,
    a group of unknown size)."""
    rule = _BUS_FACTOR.get(kind)
    if rule is None or not ranks or ranks < 1 or sent <= 0 or seconds <= 0:
        return None
    times_n, factor = rule
    size = sent * ranks if times_n else sent
    algorithm = size / seconds
    return algorithm, algorithm * factor(ranks)


def bandwidth_text(bytes_per_s: float | None) -> str:
    """ "41.2 GB/s", "870 MB/s": three figures and an SI prefix, as link speeds and nccl-tests are given."""
    from gputop.model.work import si_parts  # here: work.py imports the figures, which import this module

    if bytes_per_s is None:
        return "N/A"
    value, prefix = si_parts(bytes_per_s)
    return f"{value} {prefix}B/s"


def ms_text(seconds: float | None) -> str:
    return "N/A" if seconds is None else f"{seconds * 1e3:.1f} ms"


def collectives_text(entries: Sequence[dict[str, Any]]) -> str:
    """The report's line for a rank's ``to_dict`` entries: ``all_gather on dp 4.7x 444 KiB, 26.4 ms (26.4 exposed)``."""
    parts = []
    for e in entries:
        if not e["calls_per_step"]:  # a barrier at the end of the run: fewer than one in a hundred steps
            continue
        each = e["bytes_per_step"] / e["calls_per_step"] if e["calls_per_step"] else 0
        flight = "times N/A"
        if e["in_flight_ms"] is not None:
            flight = f"{e['in_flight_ms']:.1f} ms ({e['exposed_ms']:.1f} exposed)"
        bus = e.get("bus_bytes_per_s")  # absent from reports written before it
        bus_text = "" if bus is None else f", {bandwidth_text(bus)} bus"
        parts.append(f"{e['kind']} on {e['group']} {e['calls_per_step']:g}x {size_text(each)}, {flight}{bus_text}")
    return "; ".join(parts)


def size_text(n_bytes: float) -> str:
    """A size the way a person reads one: "512 B", "444 KiB", "12.5 MiB", "1.2 GiB"."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            value = n_bytes / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{n_bytes:.0f} B"


# A kind of collective has a last rank to arrive when the ranks' exposed times in it differ by at least this share of
# the longest: ranks that wait alike (11.1 against 11.5 ms a step) arrive together, and naming one would be noise.
LAST_TO_ARRIVE_MIN_FRAC = 0.1


def last_to_arrive(
    mine: Sequence[CollectiveFigures], peers: Sequence[tuple[int, Sequence[CollectiveFigures]]]
) -> dict[tuple[str, str], tuple[int | None, float]]:
    """Per kind and group of this rank's collectives with an exposed time: the rank that reaches it last among
    ``peers`` (this rank among them, by its number) and how much longer than that rank this one waits in it a step.

    The last rank to reach a collective waits least in it, and its peers wait for it there: a rank's wait beyond
    the least-waiting rank's is its wait for the last.  0 for the last rank itself; the rank is None where the
    ranks' waits differ by less than ``LAST_TO_ARRIVE_MIN_FRAC`` of the longest (they arrive together).
    """
    out: dict[tuple[str, str], tuple[int | None, float]] = {}
    for c in mine:
        if c.exposed_s is None:
            continue
        waits = [
            (p.exposed_s, rank)
            for rank, theirs in peers
            for p in theirs
            if p.kind == c.kind and p.group == c.group and p.exposed_s is not None
        ]
        if len(waits) >= 2:
            least, last = min(waits)
            longest = max(w for w, _ in waits)
            together = longest - least < LAST_TO_ARRIVE_MIN_FRAC * longest
            out[(c.kind, c.group)] = (None if together else last, max(c.exposed_s - least, 0.0))
    return out


def collective_figures(windows: Sequence[Window]) -> tuple[CollectiveFigures, ...]:
    """The span's collectives a step, the one that held training up the longest first."""
    carrying = [w for w in windows if w.collectives]
    steps = sum(w.timed for w in carrying)
    if not steps:
        return ()
    return tuple(
        CollectiveFigures(
            c.kind,
            c.group,
            c.calls / steps,
            c.bytes / steps,
            None if c.busy_s is None else c.busy_s / steps,
            None if c.exposed_s is None else c.exposed_s / steps,
            c.ranks,
        )
        for c in merge_collectives(w.collectives for w in carrying)
    )


# What a hang's stuck ranks say of their collectives, read by the hang and desync rules
# (gputop.diagnose.rules.collective_positions); kept beside the rest of a rank's collectives, so that
# the findings' details carry them without importing a rule.


@dataclass(frozen=True)
class InCollective:
    """A collective by its number on its group, as one rank issued it."""

    kind: str  # "all_reduce", ...; DDP_ALL_REDUCE for DDP's own
    group: str  # the group's name: a DeviceMesh dimension, "world", "pg N"
    number: int  # torch's sequence number on the group
    bytes: int | None  # what the rank sends in it (None: not measured, DDP's)

    @property
    def key(self) -> tuple[str, int]:
        return self.group, self.number

    def text(self) -> str:
        """ "all_reduce #88 on dp"."""
        return f"{self.kind} #{self.number} on {self.group}"


Reading = Literal["never_issued", "none_completed", "different", "silent"]


@dataclass(frozen=True)
class HangCollective:
    """What the stuck ranks' collectives say about a hang (``read_positions``).

    ``never_issued``: some ranks' count on the group is below the number the others wait in: theirs is the hang.
    ``none_completed``: every rank issued it and none completed it: the exchange itself (network, backend).
    ``different``: ranks wait in different collectives (another group, another number).
    ``silent``: the reporting ranks wait in one collective; the others said nothing (silent, or no numbers).
    """

    reading: Reading
    waited: InCollective  # the collective most waiting ranks are in
    waiting: tuple[int, ...]  # the ranks in it
    never_issued: tuple[tuple[int, int], ...]  # (rank, its count on the group): below the waited number
    elsewhere: tuple[tuple[int, InCollective], ...]  # ranks in another collective
    unknown: tuple[int, ...]  # stuck or silent ranks that gave no numbers
    # The waiting ranks are blocked in the collective (gloo; a blocking call); False: only their counts say they
    # issued it (NCCL returns once it is queued, and the rank waits at a later sync).
    blocked_in: bool = True

    @property
    def culprits(self) -> tuple[int, ...]:
        return tuple(rank for rank, _ in self.never_issued)
