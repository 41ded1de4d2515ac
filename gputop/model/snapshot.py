"""What the dashboard knows at one moment: immutable copies of runs, ranks and samples.

The collector's ``Store`` (``gputop.collect.store``) holds the mutable state
and hands out these frozen copies through ``snapshot(now)``; everything that
reads data (the figures, the diagnosis, the UI, the report, the recorder)
reads only these.  Pure data: no locks, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from gputop.model.digests import DigestMismatch
from gputop.model.samples import GpuSample, HostSample
from gputop.protocol import CaptureResult, Event, Hello, Stacks, Window

Status = Literal["live", "lost", "done"]
LIVE: Final = "live"
LOST: Final = "lost"  # silent, or its connection closed without a bye
DONE: Final = "done"  # said bye: the process finished

# How many of each rank's newest windows a snapshot copies per refresh, and so
# how far back the dashboard's histories reach: 4 minutes of the default 1-s windows.
SNAPSHOT_HISTORY_WINDOWS = 240
# How many newest windows a snapshot copies of every other rank: at least twice
# the figures' 10-s span for windows down to 0.5 s.  The figures read only their
# span, so a refresh copies 40 windows a rank, not 240, and only the focused ranks
# carry their history.
SPAN_COPY_WINDOWS = 40
# How many of each rank's newest windows with a step the store keeps apart from its history, so a rank stopped
# for longer than a snapshot's windows (or the history) reach still has a last step: as many as a snapshot copies.
STEPPED_KEPT = SPAN_COPY_WINDOWS


@dataclass(frozen=True)
class RankSnapshot:
    """One rank as the dashboard sees it at one moment."""

    run_id: str
    rank: int
    hello: Hello
    windows: tuple[Window, ...]
    status: Status
    status_reason: str
    last_seen_t: float
    # A done rank's bye: "exit" (finished), "signal" (SIGTERM, SIGINT), "exception" (failed); "" for any other.
    ended_how: str = ""
    events: tuple[Event, ...] = ()
    captures: tuple[CaptureResult, ...] = ()  # profiler captures it answered, oldest first
    # Where its training thread was, oldest first: one message a second from a reporter that samples its stack
    # (``gputop.model.frames`` reads them); empty from older reporters or with GPUTOP_STACKS=0.
    stacks: tuple[Stacks, ...] = ()
    # Its newest windows with a step, when ``windows`` has none (a rank stopped for longer than they reach
    # back): what its hang clock reads its last step and usual step from (``STEPPED_KEPT`` at most).
    stepped: tuple[Window, ...] = ()

    @property
    def key(self) -> str:
        """ "run_id:rank": names the rank across runs (the table's row key)."""
        return f"{self.run_id}:{self.rank}"

    @property
    def latest(self) -> Window | None:
        return self.windows[-1] if self.windows else None

    @property
    def latest_stacks(self) -> Stacks | None:
        """Where the training thread was at the newest sample this rank sent, with the places before it."""
        return self.stacks[-1] if self.stacks else None


# The run chart draws a column a second: its newest seconds on a terminal up to ~620
# columns wide.  What a snapshot carries, so a snapshot (and time travel keeps 1,200 views
# at 2 ranks) holds the chart's seconds, not the whole run's.
CHART_SECONDS = 600


@dataclass(frozen=True)
class RunHistory:
    """A run's newest whole seconds (at most CHART_SECONDS), oldest first: what its chart draws.

    Summed over every rank's windows that ended in the second, so the mean step
    time weighs every timed step once and the throughput is the run's.
    """

    first_s: float = 0.0  # the first second's start; the others follow one a second
    step_time_s: tuple[float | None, ...] = ()  # mean wall step time; None: no step timed
    samples_per_s: tuple[float | None, ...] = ()  # samples of every rank in the second; None: batch size unknown


@dataclass(frozen=True)
class RunSnapshot:
    """One training job: every rank that reported under one run id."""

    run_id: str
    name: str
    world_size: int
    first_seen_t: float
    ranks: tuple[RankSnapshot, ...]
    history: RunHistory = RunHistory()
    # Each group's first collective number at which the ranks' digests differ (a desync, even one the backend
    # went on through), lowest number first; () while they agree or where the reporters send no digests.
    desyncs: tuple[DigestMismatch, ...] = ()

    @property
    def live_ranks(self) -> int:
        return sum(1 for r in self.ranks if r.status == LIVE)


@dataclass(frozen=True)
class Snapshot:
    """Everything the dashboard knows at time ``t``."""

    t: float
    runs: tuple[RunSnapshot, ...] = ()
    gpu: GpuSample | None = None
    host: HostSample | None = None
    gpu_history: tuple[GpuSample, ...] = ()
    host_history: tuple[HostSample, ...] = ()
    listen: str = ""  # where the collector listens, for the empty-state screen
    rejected: tuple[str, ...] = ()  # recent connections closed for bad frames, with reasons
    token_refusals: int = 0  # connections refused at the token handshake, since the collector started
    # Other hosts' GPUs, from their node samplers (``gputop.node``), by host name: the latest
    # sample of each host still sending (``node_gpus``), and each host's history, oldest first.
    node_gpus: tuple[GpuSample, ...] = ()
    node_gpu_history: Mapping[str, tuple[GpuSample, ...]] = field(default_factory=dict)

    def all_ranks(self) -> list[RankSnapshot]:
        return [rank for run in self.runs for rank in run.ranks]

    def gpu_samples(self) -> Iterator[GpuSample]:
        """Every GPU sample kept, this machine's and every other host's (each GPU's UUID is its key)."""
        yield from self.gpu_history
        for history in self.node_gpu_history.values():
            yield from history

    def gpu_history_of(self, hostname: str) -> tuple[GpuSample, ...]:
        """The GPU samples of the host a rank names in its hello: its node's, else this machine's."""
        return self.node_gpu_history.get(hostname) or self.gpu_history
