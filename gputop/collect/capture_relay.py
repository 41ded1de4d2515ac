"""The collector's downstream side: capture requests to a rank's connection, results back to the asker.

It also tells a run's ranks the findings the dashboard shows for it
(``FindingsNotice``), so the ranks can log them beside their loss.

Runs on the collector's event loop.  A request comes from the dashboard
(``Collector.request_capture``, any thread) or from a ``gputop capture``
client, whose connection opens with the request instead of a hello.  It goes
down the connection the rank itself reports on, so only a reporter that
connected to this collector (the per-user socket, or loopback with the same
port) can be asked, and the only thing it can be asked is a ``CaptureRequest``.
The rank's ``CaptureResult`` comes back up like any message (the store keeps
it for the dashboard) and is also handed to whoever asked.

Frames go down through a ``Downlink`` (the collector's ``Connection``), which
never waits and drops what a rank that stopped reading would only pile up: a
dropped findings notice is made good when the rank catches up (``caught_up``),
a capture request that cannot be queued is answered as refused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import time
from typing import Protocol

import msgspec

from gputop import auth
from gputop.address import Address
from gputop.protocol import (
    MAX_FRAME_BYTES,
    CaptureRequest,
    CaptureResult,
    FindingBrief,
    FindingsNotice,
    Message,
    ProtocolError,
    decode,
    decode_command,
    encode,
)

ANSWER_GRACE_S = 10.0  # beyond the request's own timeout: the collector answers a timeout itself

MAX_RUNS_TOLD = 64  # runs whose last findings are kept for ranks that connect later (the store's run cap)

RankKey = tuple[str, int]


class Downlink(Protocol):
    """The way down to a rank: its reporter's connection."""

    def send(self, frame: bytes) -> bool:
        """Queue ``frame`` without waiting; False when it was dropped (the connection is closing or not read)."""
        ...


def is_capture_request(frame: bytes) -> bool:
    """A connection's first frame names a capture request (a cheap look: most frames are windows)."""
    return b'"type":"capture"' in frame


def refused(request: CaptureRequest, why: str, run_id: str = "") -> CaptureResult:
    """A result that says why a capture did not happen."""
    return CaptureResult(run_id=run_id or request.run_id or "-", rank=request.rank, id=request.id, t=time.time(),
                         ok=False, error=why)  # fmt: skip


class CaptureRelay:
    """Which connection each rank reports on, and the requests waiting for their rank's answer."""

    def __init__(self) -> None:
        self._links: dict[RankKey, Downlink] = {}
        self._waiting: dict[str, tuple[RankKey, asyncio.Future[CaptureResult]]] = {}
        self._findings: dict[str, tuple[FindingBrief, ...]] = {}  # last told, per run: for ranks that come later

    # -- called by the collector's connection handler ------------------------------------

    def connected(self, ranks: dict[RankKey, int], link: Downlink, accepted: list[Message]) -> None:
        """A batch arrived on a reporter's connection: note its ranks, hand results to their askers."""
        for key in ranks:
            if self._links.get(key) is not link:
                self._links[key] = link  # the newest connection speaks for the rank
                told = self._findings.get(key[0])
                if told:  # a rank that (re)connects hears what the others heard
                    link.send(encode(FindingsNotice(run_id=key[0], rank=key[1], t=time.time(), findings=told)))
        for message in accepted:
            if isinstance(message, CaptureResult):
                entry = self._waiting.get(message.id)
                if entry is not None and not entry[1].done():
                    entry[1].set_result(message)

    def caught_up(self, ranks: dict[RankKey, int], link: Downlink) -> None:
        """A rank that had stopped reading reads again: tell it its run's findings now (it missed some)."""
        now = time.time()
        for run_id, rank in ranks:
            if self._links.get((run_id, rank)) is link:
                told = self._findings.get(run_id, ())
                link.send(encode(FindingsNotice(run_id=run_id, rank=rank, t=now, findings=told)))

    def gone(self, key: RankKey, link: Downlink, why: str) -> None:
        """A rank's connection ended: a capture waiting on it fails now, not at its timeout."""
        if self._links.get(key) is link:
            del self._links[key]
            for request_id, (target, waiter) in self._waiting.items():
                if target == key and not waiter.done():
                    waiter.set_result(CaptureResult(run_id=key[0], rank=key[1], id=request_id, t=time.time(),
                                                    ok=False, error=f"the rank's connection ended: {why}"))  # fmt: skip

    async def answer(self, frame: bytes) -> CaptureResult:
        """A ``gputop capture`` connection's request (its first frame): the rank's result, or why there is none."""
        try:
            request = decode_command(frame)
            if not isinstance(request, CaptureRequest):
                raise ProtocolError(f"a {request.TYPE} frame is not a capture request")
        except ProtocolError as exc:
            return CaptureResult(run_id="-", rank=0, id="-", t=time.time(), ok=False, error=f"bad request: {exc}")
        return await self.relay(request)

    # -- telling ranks their run's findings (for their trainer's logger) -----------------

    def notify_findings_from_thread(
        self, run_id: str, findings: tuple[FindingBrief, ...], loop: asyncio.AbstractEventLoop | None
    ) -> None:
        """Send every connected rank of ``run_id`` the findings shown for it now; from any thread, no waiting."""
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(self._notify_findings, run_id, findings)

    def _notify_findings(self, run_id: str, findings: tuple[FindingBrief, ...]) -> None:
        now = time.time()
        if findings:
            self._findings.pop(run_id, None)
            self._findings[run_id] = findings  # newest last: the oldest go first past MAX_RUNS_TOLD
            while len(self._findings) > MAX_RUNS_TOLD:
                del self._findings[next(iter(self._findings))]
        else:
            self._findings.pop(run_id, None)  # cleared: nothing to repeat to a rank that comes later
        for (run, rank), link in list(self._links.items()):
            if run == run_id:
                # Dropped for a rank that stopped reading: it hears the run's findings as they are when it catches up.
                link.send(encode(FindingsNotice(run_id=run, rank=rank, t=now, findings=findings)))

    # -- asking -------------------------------------------------------------------------

    def request_from_thread(
        self, request: CaptureRequest, loop: asyncio.AbstractEventLoop | None
    ) -> concurrent.futures.Future[CaptureResult]:
        """``relay`` from another thread (the dashboard's)."""
        if loop is None or not loop.is_running():
            done: concurrent.futures.Future[CaptureResult] = concurrent.futures.Future()
            done.set_result(refused(request, "the collector is not running"))
            return done
        return asyncio.run_coroutine_threadsafe(self.relay(request), loop)

    async def relay(self, request: CaptureRequest) -> CaptureResult:
        """Send the request down its rank's connection and wait for the result, or say why there is none."""
        matches = [key for key in self._links if key[1] == request.rank and request.run_id in ("", key[0])]
        if not matches:
            where = f"run {request.run_id} " if request.run_id else ""
            return refused(request, f"no {where}rank {request.rank} is reporting to this collector")
        if request.id in self._waiting:
            return refused(request, f"capture id {request.id} is already in use")
        target = matches[-1]  # the newest run with that rank
        waiter: asyncio.Future[CaptureResult] = asyncio.get_running_loop().create_future()
        self._waiting[request.id] = (target, waiter)
        try:
            if not self._links[target].send(encode(msgspec.structs.replace(request, run_id=target[0]))):
                why = "takes no commands now (closing, or its reporter stopped reading)"
                return refused(request, f"rank {request.rank}'s connection {why}", target[0])
            return await asyncio.wait_for(waiter, request.timeout_s)
        except (TimeoutError, asyncio.TimeoutError):
            return refused(request, f"rank {request.rank} sent no result in {request.timeout_s:g} s", target[0])
        finally:
            self._waiting.pop(request.id, None)


def ask(address: Address, request: CaptureRequest) -> CaptureResult:
    """``gputop capture``'s side: send one request to the collector at ``address`` and wait for the answer.

    Raises OSError when nothing listens there, ProtocolError when what answers is not a collector.
    """
    if address.is_tcp:
        sock = socket.create_connection(address.tcp_endpoint, timeout=5.0)
        try:  # a TCP collector greets every connection with the token handshake, this one too
            sock, refusal = auth.secure_client(sock, auth.Security.from_env(), address.host, str(address))
        except auth.HandshakeError as exc:
            raise ProtocolError(f"{address} is not a gputop collector that speaks this version ({exc})") from None
        if refusal:
            sock.close()
            raise PermissionError(refusal)  # not "nothing listens": the CLI prints the reason
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5.0)
        sock.connect(str(address.path))
    with contextlib.closing(sock):
        sock.sendall(encode(request))
        sock.settimeout(request.timeout_s + ANSWER_GRACE_S)
        data = b""
        while b"\n" not in data and len(data) <= MAX_FRAME_BYTES:
            chunk = sock.recv(MAX_FRAME_BYTES)
            if not chunk:
                break
            data += chunk
    answer = decode(data.split(b"\n", 1)[0]) if data.strip() else None
    if not isinstance(answer, CaptureResult):
        raise ProtocolError("the collector closed the connection without an answer (an older gputop?)")
    return answer
