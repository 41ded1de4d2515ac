"""Where a dashboard's snapshots come from: a live collector or a recording.

The UI knows only this interface: ``start()``, ``snapshot()`` (cheap, safe from
any thread), ``stop()``, and a few facts for its header.  A live source owns the
collector server and the samplers; a replay source feeds a recording into a
store at the recorded pace.  Both are in ``gputop.collect.live`` and
``gputop.collect.replay``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from gputop.model.snapshot import Snapshot

if TYPE_CHECKING:  # the model loads no threading: the types are for the checker
    import concurrent.futures

    from gputop.protocol import CaptureRequest, CaptureResult, FindingBrief


class SnapshotSource(Protocol):
    """What the dashboard reads."""

    kind: str  # "live" or "replay"
    # Rank keys whose whole history a snapshot carries (the UI's selected rank);
    # every other rank carries only its figures' span.
    focus: frozenset[str]

    @property
    def description(self) -> str:
        """ "listening on /run/user/1000/gputop/gputop.sock", "replay of run.jsonl at 4x" (read-only: a live
        source says where its collector listens)."""
        ...

    def start(self) -> None: ...

    def snapshot(self) -> Snapshot: ...

    def stop(self) -> None: ...

    @property
    def finished(self) -> bool:
        """A replay that reached the end of its recording; always False live."""
        ...


@runtime_checkable
class TalksToRanks(Protocol):
    """A source with ranks on the line (a live one; a replay has none): it can ask and tell them.

    ``isinstance(source, TalksToRanks)`` is how the dashboard knows it may.
    """

    def request_capture(self, request: CaptureRequest) -> concurrent.futures.Future[CaptureResult]:
        """Have a rank profile its next steps; the future holds its result."""
        ...

    def notify_findings(self, run_id: str, findings: tuple[FindingBrief, ...]) -> None:
        """Tell a run's ranks the findings shown for it, for their trainer's logger."""
        ...


class FixedSource:
    """A source that always returns the same snapshot: for tests and screenshots."""

    kind = "fixed"

    def __init__(self, snapshot: Snapshot, description: str = "fixed data") -> None:
        self._snapshot = snapshot
        self.description = description
        self.focus: frozenset[str] = frozenset()

    def start(self) -> None:
        pass

    def snapshot(self) -> Snapshot:
        return self._snapshot

    def set(self, snapshot: Snapshot) -> None:
        """Replace the snapshot (tests use this to make a rank appear or get lost)."""
        self._snapshot = snapshot

    def stop(self) -> None:
        pass

    @property
    def finished(self) -> bool:
        return False
