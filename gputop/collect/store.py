"""The dashboard's memory: per run and rank, bounded histories of windows.

Written by the collector thread (or by a recording being read), read by the UI,
the recorder and the diagnosis through ``snapshot()``, which returns the
immutable copies of ``gputop.model.snapshot``.  One lock guards the mutable state; it is held only for dict and deque
operations and for encoding or decoding a rank's older windows (``WindowHistory``), never for I/O.  Time is
passed in, not read from the clock, so a replay drives the same code at its own pace and tests need no sleeping.
"""

from __future__ import annotations

import socket
import threading
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from gputop.collect.digests import DigestBook
from gputop.collect.run_seconds import RUN_SECOND_SETTLE_S, RunSeconds
from gputop.collect.window_history import WindowHistory
from gputop.model.digests import DigestMismatch
from gputop.model.samples import GpuSample, HostSample
from gputop.model.snapshot import (
    DONE,
    LIVE,
    LOST,
    STEPPED_KEPT,
    RankSnapshot,
    RunHistory,
    RunSnapshot,
    Snapshot,
    Status,
)
from gputop.protocol import Bye, CaptureResult, Event, Hello, Message, Stacks, Window

HISTORY_WINDOWS = 1200  # 20 minutes of the default 1-s windows per rank (10 of 0.5-s ones)
# Windows kept across all ranks (a rank's newest 40 are 1.2-KiB objects, the older
# ones 0.45 KiB encoded: ``WindowHistory``): at 125 ranks or fewer each keeps all
# 1,200; at 1,024 each keeps 146 windows (146 s at the default 1-s window), so the
# dashboard's memory stays flat however many ranks report.  The run's step-time and throughput history is kept apart,
# per second, for as long as its chart shows (``RunHistory``, CHART_SECONDS).
WINDOW_BUDGET = 150_000
# 60 s of 1-s windows, 30 s of 0.5-s ones: the figures' 10-s span with room to scroll back.
MIN_HISTORY_WINDOWS = 60
HISTORY_SAMPLES = 600  # 10 minutes of 1 s GPU/host samples
HISTORY_EVENTS = 100
HISTORY_CAPTURES = 10  # profiler captures kept per rank (their traces are files; this is their summary)
# Where the training thread was, about one message a second per rank: the figures' 10-s span and
# room to spare.  ~1 KiB each, so 30 MiB at 1,024 ranks; a whole recording keeps them all.
HISTORY_STACKS = 30
MAX_RUNS = 64  # runs kept; beyond it the oldest finished run is forgotten
LOST_AFTER_S = 5.0  # ten silent windows: the rank is hung, stopped or its dashboard link is gone
# A host's GPUs leave the live join after this long without a sample from its node sampler
# (its job ended, or the sampler died): ten missed 1-s samples.  Its history stays.
NODE_GPU_STALE_S = 10.0
MAX_NODE_HOSTS = 4096  # hosts whose GPUs are kept; beyond it the longest silent one is forgotten
# Other hosts' GPU samples kept over all hosts (a sample of 8 GPUs is ~6 KiB as Python
# objects): 8 hosts keep 10 minutes each, 128 hosts 37 s (the figures read 10 s, the
# sparklines up to 2 minutes), so the dashboard's memory stays flat however many nodes send.
NODE_SAMPLE_BUDGET = 4800
MIN_NODE_SAMPLES = 30


@dataclass
class _Rank:
    hello: Hello
    first_seen_t: float
    last_seen_t: float
    windows: WindowHistory
    events: deque[Event] = field(default_factory=lambda: deque(maxlen=HISTORY_EVENTS))
    captures: deque[CaptureResult] = field(default_factory=lambda: deque(maxlen=HISTORY_CAPTURES))
    stacks: deque[Stacks] = field(default_factory=lambda: deque(maxlen=HISTORY_STACKS))
    stepped: deque[Window] = field(default_factory=lambda: deque(maxlen=STEPPED_KEPT))  # its newest with a step
    connected: bool = True
    done: bool = False
    done_reason: str = "finished"  # how its bye says it ended: "finished", "ended by SIGTERM", "failed: …"
    done_how: str = "exit"  # and the bye's own word for it: exit, signal, exception
    lost_reason: str = ""
    last_seq: int = -1


class Store:
    """Thread-safe store of everything received; ``snapshot()`` for readers."""

    def __init__(
        self,
        *,
        lost_after_s: float = LOST_AFTER_S,
        listen: str = "",
        history_windows: int | None = HISTORY_WINDOWS,
        history_samples: int | None = HISTORY_SAMPLES,
    ) -> None:
        """``None`` histories keep everything (reading a whole recording)."""
        self._lock = threading.Lock()
        self._history_windows = history_windows
        self._ranks: dict[tuple[str, int], _Rank] = {}
        self._run_seconds: dict[str, RunSeconds] = {}
        self._digests: dict[str, DigestBook] = {}  # each run's collective digests, compared across its ranks
        self._gpu: deque[GpuSample] = deque(maxlen=history_samples)
        self._history_samples = history_samples
        self._node_gpu: dict[str, deque[GpuSample]] = {}  # other hosts' GPUs, by host name
        self._host: deque[HostSample] = deque(maxlen=history_samples)
        self._rejected: deque[str] = deque(maxlen=20)
        self.token_refusals = 0  # connections refused for a wrong or missing token
        self.lost_after_s = lost_after_s
        self.listen = listen
        # Called with each GPU or host sample after it is stored (the recorder taps here).
        self.sample_listeners: list[Callable[[GpuSample | HostSample], None]] = []

    def ingest(self, message: Message, now: float) -> None:
        """Take one decoded message.  A window before any hello is ignored."""
        with self._lock:
            self._ingest(message, now)

    def ingest_many(self, messages: Iterable[Message], now: float) -> None:
        """Take a batch of messages received together, under one acquisition of the lock."""
        with self._lock:
            for message in messages:
                self._ingest(message, now)

    def _ingest(self, message: Message, now: float) -> None:
        key = (message.run_id, message.rank)
        rank = self._ranks.get(key)
        if isinstance(message, Hello):
            if rank is None and not any(r == message.run_id for r, _ in self._ranks):
                self._evict_finished_runs()
            if rank is None or (message.pid and rank.hello.pid and message.pid != rank.hello.pid):
                # First hello, or a new process under the same name (a restarted
                # rank, a later job on the same port): its windows count from 1.
                self._ranks[key] = _Rank(
                    hello=message,
                    first_seen_t=now,
                    last_seen_t=now,
                    windows=WindowHistory(self._per_rank_windows()),
                    stacks=deque(maxlen=None if self._history_windows is None else HISTORY_STACKS),
                )
                self._fit_history()
            else:
                rank.hello = message
                rank.last_seen_t = now
                rank.connected, rank.done, rank.lost_reason = True, False, ""
            return
        if rank is None:
            return
        rank.last_seen_t = now
        if isinstance(message, Window):
            if message.seq <= rank.last_seq:
                return  # a backlog window seen before, re-sent after a reconnect
            rank.last_seq = message.seq
            rank.windows.append(message)
            if message.steps > 0:
                rank.stepped.append(message)
            run = self._run_seconds.get(message.run_id)
            if run is None:
                run = self._run_seconds[message.run_id] = RunSeconds()
            run.add(message)
            if message.digests or message.digest_sites:
                book = self._digests.get(message.run_id)
                if book is None:
                    book = self._digests[message.run_id] = DigestBook()
                book.add(message.rank, message)
        elif isinstance(message, Event):
            rank.events.append(message)
        elif isinstance(message, CaptureResult):
            rank.captures.append(message)
        elif isinstance(message, Stacks):
            rank.stacks.append(message)
        elif isinstance(message, Bye):
            rank.done = True
            rank.done_reason, rank.done_how = ended_text(message), message.how

    def _per_rank_windows(self) -> int | None:
        if self._history_windows is None:
            return None
        share = WINDOW_BUDGET // max(len(self._ranks), 1)
        return max(min(self._history_windows, share), min(MIN_HISTORY_WINDOWS, self._history_windows))

    def _fit_history(self) -> None:
        """Shorten every rank's history when more ranks joined than the budget allows at the old length."""
        keep = self._per_rank_windows()
        if keep is None:
            return
        for state in self._ranks.values():
            if state.windows.maxlen is not None and state.windows.maxlen > keep:
                state.windows.shorten(keep)

    def disconnected(self, run_id: str, rank: int, reason: str, pid: int | None = None) -> None:
        """The connection a rank reported on closed (``reason`` says how).

        ``pid`` is the process that said hello on that connection: the close of
        a replaced process's connection must not mark its successor lost.
        """
        with self._lock:
            state = self._ranks.get((run_id, rank))
            if state is not None and (not pid or not state.hello.pid or pid == state.hello.pid):
                state.connected = False
                if not state.done:
                    state.lost_reason = reason

    def _evict_finished_runs(self) -> None:
        """Keep at most MAX_RUNS runs: a dashboard open for days forgets the oldest finished ones."""
        runs: dict[str, list[_Rank]] = {}
        for (run_id, _), state in self._ranks.items():
            runs.setdefault(run_id, []).append(state)
        if len(runs) < MAX_RUNS:
            return
        finished = [
            (max(s.last_seen_t for s in states), run_id)
            for run_id, states in runs.items()
            if all(s.done or not s.connected for s in states)
        ]
        for _, run_id in sorted(finished)[: len(runs) - MAX_RUNS + 1]:
            for key in [k for k in self._ranks if k[0] == run_id]:
                del self._ranks[key]
            self._run_seconds.pop(run_id, None)
            self._digests.pop(run_id, None)

    def rejected(self, reason: str) -> None:
        """Remember why a connection was closed for a bad frame (shown in the UI)."""
        with self._lock:
            self._rejected.append(reason)

    def refused_token(self) -> None:
        """Count a connection refused at the token handshake (its reason is already in ``rejected``)."""
        with self._lock:
            self.token_refusals += 1

    def add_gpu(self, sample: GpuSample) -> None:
        with self._lock:
            self._gpu.append(sample)
        for listener in self.sample_listeners:
            listener(sample)

    def add_node_gpu(self, sample: GpuSample) -> None:
        """Another host's GPUs (``sample.hostname`` set), as its node sampler sent them."""
        with self._lock:
            history = self._node_gpu.get(sample.hostname)
            if history is None:
                if len(self._node_gpu) >= MAX_NODE_HOSTS:
                    silent = min(self._node_gpu, key=lambda host: self._node_gpu[host][-1].t)
                    del self._node_gpu[silent]
                history = self._node_gpu[sample.hostname] = deque(
                    maxlen=self._per_host_samples(len(self._node_gpu) + 1)
                )
                for host, kept in self._node_gpu.items():
                    if kept.maxlen is not None and history.maxlen is not None and kept.maxlen > history.maxlen:
                        self._node_gpu[host] = deque(kept, maxlen=history.maxlen)
                history = self._node_gpu[sample.hostname]
            history.append(sample)
        for listener in self.sample_listeners:
            listener(sample)

    def _per_host_samples(self, hosts: int) -> int | None:
        if self._history_samples is None:
            return None  # a whole recording: keep everything
        return max(min(self._history_samples, NODE_SAMPLE_BUDGET // max(hosts, 1)), MIN_NODE_SAMPLES)

    def add_host(self, sample: HostSample) -> None:
        with self._lock:
            self._host.append(sample)
        for listener in self.sample_listeners:
            listener(sample)

    def rank_pids(self, *, include_finished: bool = False, hostname: str | None = None) -> list[int]:
        """Pids of the ranks still reporting (for the host sampler), or of every rank seen.

        ``hostname``: only the ranks on that host (or that did not say).  Another
        host's pid means nothing here: read from this machine's /proc it would be
        some local process (in containers, where every rank is a low pid, likely one).
        """
        with self._lock:
            return [
                r.hello.pid
                for r in self._ranks.values()
                if r.hello.pid
                and (include_finished or (r.connected and not r.done))
                and (hostname is None or not r.hello.hostname or r.hello.hostname == hostname)
            ]

    def local_rank_pids(self) -> list[int]:
        """Pids of this machine's reporting ranks: what the host sampler reads."""
        return self.rank_pids(hostname=socket.gethostname())

    def snapshot(
        self, now: float, *, history: int | None = None, full: Collection[str] = (), full_history: int | None = None
    ) -> Snapshot:
        """Immutable copies of everything, with each rank's status as of ``now``.

        ``history`` limits how many of each rank's newest windows are copied;
        the ranks whose keys ("run_id:rank") are in ``full`` get ``full_history``
        (the one rank whose sparklines are on screen, say).
        """
        with self._lock:
            by_run: dict[str, list[tuple[float, RankSnapshot]]] = {}
            for (run_id, rank_no), state in self._ranks.items():
                keep = full_history if (full and f"{run_id}:{rank_no}" in full) else history
                rank = self._rank_snapshot(run_id, rank_no, state, keep, now)
                by_run.setdefault(run_id, []).append((state.first_seen_t, rank))
            gpu_history, host_history = tuple(self._gpu), tuple(self._host)
            node_history = {host: tuple(samples) for host, samples in sorted(self._node_gpu.items())}
            rejected = tuple(self._rejected)
            settled = now - RUN_SECOND_SETTLE_S
            histories = {run_id: seconds.chart(settled) for run_id, seconds in self._run_seconds.items()}
            desyncs = {run_id: book.mismatches() for run_id, book in self._digests.items()}
            token_refusals = self.token_refusals
        return Snapshot(
            t=now,
            runs=_run_snapshots(by_run, histories, desyncs),
            gpu=gpu_history[-1] if gpu_history else None,
            host=host_history[-1] if host_history else None,
            gpu_history=gpu_history,
            host_history=host_history,
            listen=self.listen,
            rejected=rejected,
            token_refusals=token_refusals,
            node_gpus=tuple(h[-1] for h in node_history.values() if h and now - h[-1].t <= NODE_GPU_STALE_S),
            node_gpu_history=node_history,
        )

    def _rank_snapshot(self, run_id: str, rank_no: int, state: _Rank, keep: int | None, now: float) -> RankSnapshot:
        windows = state.windows.newest(keep)
        status, reason = self._status(state, now)
        return RankSnapshot(
            run_id=run_id,
            rank=rank_no,
            hello=state.hello,
            windows=windows,
            status=status,
            status_reason=reason,
            last_seen_t=state.last_seen_t,
            ended_how=state.done_how if status == DONE else "",
            events=tuple(state.events),
            captures=tuple(state.captures),
            stacks=tuple(state.stacks),
            # A rank stopped for longer than its copied windows reach keeps its last steps in view.
            stepped=tuple(state.stepped) if _stopped_before(windows, state.stepped) else (),
        )

    def _status(self, state: _Rank, now: float) -> tuple[Status, str]:
        if state.done:
            return DONE, state.done_reason
        if not state.connected:
            return LOST, state.lost_reason or "connection closed"
        silent_s = now - state.last_seen_t
        if silent_s > self.lost_after_s:
            return LOST, f"silent for {silent_s:.0f} s"
        return LIVE, ""


def _run_snapshots(
    by_run: dict[str, list[tuple[float, RankSnapshot]]],
    histories: dict[str, RunHistory],
    desyncs: dict[str, tuple[DigestMismatch, ...]],
) -> tuple[RunSnapshot, ...]:
    """Each run's snapshot, its ranks by number and the runs by when each was first seen."""
    runs = []
    for run_id, entries in by_run.items():
        ranks = tuple(sorted((v for _, v in entries), key=lambda v: v.rank))
        runs.append(
            RunSnapshot(
                run_id=run_id,
                name=ranks[0].hello.name,
                world_size=max(v.hello.world_size for v in ranks),
                first_seen_t=min(t for t, _ in entries),
                ranks=ranks,
                history=histories.get(run_id, RunHistory()),
                desyncs=desyncs.get(run_id, ()),
            )
        )
    return tuple(sorted(runs, key=lambda r: r.first_seen_t))


def ended_text(bye: Bye) -> str:
    """How a rank ended, as its status says it: "finished", "ended by SIGTERM", "failed: RuntimeError: …"."""
    if bye.how == "signal":
        return f"ended by {bye.detail or 'a signal'}"
    if bye.how == "exception":
        return f"failed: {bye.detail}" if bye.detail else "failed"
    return "finished"


def _stopped_before(windows: tuple[Window, ...], stepped: deque[Window]) -> bool:
    """The rank's newest window with a step is older than every window copied of it."""
    return bool(stepped) and (not windows or stepped[-1].t1 < windows[0].t1)
