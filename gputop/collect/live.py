"""A live snapshot source: the collector server plus the GPU and host samplers."""

from __future__ import annotations

import concurrent.futures
import time

from gputop.address import Address
from gputop.collect.gpu.sampler import GpuSamplerThread
from gputop.collect.host import HostSamplerThread
from gputop.collect.recording import Recorder
from gputop.collect.server import Collector
from gputop.collect.store import Store
from gputop.model.snapshot import SNAPSHOT_HISTORY_WINDOWS, SPAN_COPY_WINDOWS, Snapshot
from gputop.protocol import CaptureRequest, CaptureResult, FindingBrief


class LiveSource:
    """Listens for reporters and samples this machine's GPUs and CPUs."""

    kind = "live"

    def __init__(
        self,
        address: Address,
        *,
        sample_interval_s: float = 1.0,
        recorder: Recorder | None = None,
    ) -> None:
        """``recorder`` gets everything the store does: messages, disconnects and samples."""
        self.store = Store()
        if recorder is None:
            self.collector = Collector(self.store, address)
        else:
            self.collector = Collector(
                self.store, address, on_message=recorder.message, on_disconnect=recorder.disconnect
            )
            self.store.sample_listeners.append(recorder.sample)
        self._gpu = GpuSamplerThread(self.store, sample_interval_s)
        self._host = HostSamplerThread(self.store, self.store.local_rank_pids, sample_interval_s)
        self._started = False
        self.focus: frozenset[str] = frozenset()  # rank keys whose whole history the UI shows

    @property
    def description(self) -> str:
        return f"listening on {self.collector.address}"

    @property
    def address(self) -> Address:
        return self.collector.address

    def start(self) -> None:
        """Bind first (AddressError if taken), then start sampling.  Idempotent."""
        if self._started:
            return
        self.collector.start()
        self._gpu.start()
        self._host.start()
        self._started = True

    def snapshot(self) -> Snapshot:
        return self.store.snapshot(
            time.time(), history=SPAN_COPY_WINDOWS, full=self.focus, full_history=SNAPSHOT_HISTORY_WINDOWS
        )

    def request_capture(self, request: CaptureRequest) -> concurrent.futures.Future[CaptureResult]:
        """Have a rank profile its next steps; the future holds its result (also kept in the store)."""
        return self.collector.request_capture(request)

    def notify_findings(self, run_id: str, findings: tuple[FindingBrief, ...]) -> None:
        """Tell a run's ranks the findings shown for it, for their trainer's logger."""
        self.collector.notify_findings(run_id, findings)

    def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        self._gpu.stop()
        self._host.stop()
        self.collector.stop()

    @property
    def finished(self) -> bool:
        return False
