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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import time

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
        self._writers: dict[RankKey, asyncio.StreamWriter] = {}
        self._waiting: dict[str, tuple[RankKey, asyncio.Future[CaptureResult]]] = {}
        self._findings: dict[str, tuple[FindingBrief, ...]] = {}  # last told, per run: for ranks that come later

    # -- called by the collector's connection handler ------------------------------------

    def connected(self, ranks: dict[RankKey, int], writer: asyncio.StreamWriter, accepted: list[Message]) -> None:
        """A batch arrived on a reporter's connection: note its ranks, hand results to their askers."""
        for key in ranks:
            if self._writers.get(key) is not writer:
                self._writers[key] = writer  # the newest connection speaks for the rank
                told = self._findings.get(key[0])
                if told and not writer.is_closing():  # a rank that (re)connects hears what the others heard
                    writer.write(encode(FindingsNotice(run_id=key[0], rank=key[1], t=time.time(), findings=told)))
        for message in accepted:
            if isinstance(message, CaptureResult):
                entry = self._waiting.get(message.id)
                if entry is not None and not entry[1].done():
                    entry[1].set_result(message)

    def gone(self, key: RankKey, writer: asyncio.StreamWriter, why: str) -> None:
        """A rank's connection ended: a capture waiting on it fails now, not at its timeout."""
        if self._writers.get(key) is writer:
            del self._writers[key]
            for request_id, (target, waiter) in self._waiting.items():
                if target == key and not waiter.done():
                    waiter.set_result(CaptureResult(run_id=key[0], rank=key[1], id=request_id, t=time.time(),
                                                    ok=False, error=f"the rank's connection ended: {why}"))  # fmt: skip

    async def serve_client(self, frame: bytes, writer: asyncio.StreamWriter) -> str:
        """A ``gputop capture`` connection: one request in, the rank's result out; the reason to close."""
        try:
            request = decode_command(frame)
            if not isinstance(request, CaptureRequest):
                raise ProtocolError(f"a {request.TYPE} frame is not a capture request")
        except ProtocolError as exc:
            answer = CaptureResult(run_id="-", rank=0, id="-", t=time.time(), ok=False, error=f"bad request: {exc}")
        else:
            answer = await self.relay(request)
        writer.write(encode(answer))
        await writer.drain()
        return "capture answered"

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
        for (run, rank), writer in list(self._writers.items()):
            if run == run_id and not writer.is_closing():
                # A slow rank's buffer grows by one small frame per change; the kernel and asyncio hold it.
                writer.write(encode(FindingsNotice(run_id=run, rank=rank, t=now, findings=findings)))

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
        matches = [key for key in self._writers if key[1] == request.rank and request.run_id in ("", key[0])]
        if not matches:
            where = f"run {request.run_id} " if request.run_id else ""
            return refused(request, f"no {where}rank {request.rank} is reporting to this collector")
        if request.id in self._waiting:
            return refused(request, f"capture id {request.id} is already in use")
        target = matches[-1]  # the newest run with that rank
        waiter: asyncio.Future[CaptureResult] = asyncio.get_running_loop().create_future()
        self._waiting[request.id] = (target, waiter)
        try:
            writer = self._writers[target]
            writer.write(encode(msgspec.structs.replace(request, run_id=target[0])))
            await writer.drain()
            return await asyncio.wait_for(waiter, request.timeout_s)
        except (TimeoutError, asyncio.TimeoutError):
            return refused(request, f"rank {request.rank} sent no result in {request.timeout_s:g} s", target[0])
        except (ConnectionError, OSError) as exc:
            return refused(request, f"rank {request.rank}'s connection failed: {exc}", target[0])
        finally:
            self._waiting.pop(request.id, None)


def ask(address: Address, request: CaptureRequest) -> CaptureResult:
    """``gputop capture``'s side: send one request to the collector at ``address`` and wait for the answer.

    Raises OSError when nothing listens there, ProtocolError when what answers is not a collector.
    """
    if address.is_tcp:
        sock = socket.create_connection((address.host, address.port), timeout=5.0)
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
