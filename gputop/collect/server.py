"""The collector: an asyncio server, on its own thread, that reporters connect to.

Many reporters from many runs; each connection starts with a hello and then
streams windows.  A node sampler's connection (``gputop.node``) sends ``gpus``
frames instead, one host's NVML readings a second, and needs no hello.  A
malformed, oversized or wrong-version frame closes that one connection with a
logged reason and never the collector.  The listening socket is bound in
``start()`` on the caller's thread, so "address in use" is an ordinary
exception the CLI can turn into one line.

A TCP connection is admitted first (``_admit``: the token handshake of
``gputop.auth``, inside TLS when a certificate is given); a listener off
loopback refuses to start without a token.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from gputop import auth
from gputop.address import Address, AddressError, default_socket_path, ensure_private_dir
from gputop.collect.capture_relay import CaptureRelay, is_capture_request
from gputop.collect.store import Store
from gputop.model.samples import GpuSample, gpu_sample_from_wire
from gputop.procfs import name_this_thread
from gputop.protocol import (
    MAX_FRAME_BYTES,
    Bye,
    CaptureRequest,
    CaptureResult,
    FindingBrief,
    Gpus,
    Hello,
    Message,
    ProtocolError,
    decode_upstream,
)

log = logging.getLogger("gputop.collector")

# Called on the collector thread with each accepted message and its receive time.
MessageListener = Callable[[Message, float], None]
# Called on the collector thread when a rank's connection ends: run_id, rank, reason, time, pid.
DisconnectListener = Callable[[str, int, str, float, int], None]
# A reporter speaks for one rank (two while it learns its real name); more is a misbehaving peer.
MAX_RANKS_PER_CONNECTION = 8
READ_CHUNK_BYTES = 256 * 1024
AUTH_TIMEOUT_S = 10.0  # a reporter answers a challenge in one round trip


class Collector:
    """Listens on an address and feeds every valid message into a store."""

    def __init__(
        self,
        store: Store,
        address: Address,
        *,
        on_message: MessageListener | None = None,
        on_disconnect: DisconnectListener | None = None,
        security: auth.Security | None = None,
    ) -> None:
        self.store = store
        self.address = address
        self.security = security if security is not None else auth.Security.from_env()
        self.on_message = on_message
        self.on_disconnect = on_disconnect
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self.captures = CaptureRelay()  # profiler capture requests down to ranks, results back
        self._ssl: Any = None

    def start(self) -> None:
        """Bind (raising AddressError with a one-line reason) and serve on a daemon thread."""
        if self.address.is_tcp and not auth.is_loopback(self.address.host) and not self.security.token:
            raise AddressError(
                f"refusing to listen on {self.address} without GPUTOP_TOKEN: anyone on the network could feed it"
            )
        ssl_context = self._ssl_context()
        self._sock = self._bind()
        self._ssl = ssl_context
        if self.address.is_tcp and self.address.port == 0:  # an ephemeral port: say which one
            self.address = Address(host=self.address.host, port=self._sock.getsockname()[1])
        self.store.listen = str(self.address)
        self._thread = threading.Thread(target=self._serve_forever, name="gputop-collector", daemon=True)
        self._thread.start()
        self._ready.wait(5.0)

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(2.0)
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        if not self.address.is_tcp and self.address.path is not None:
            with contextlib.suppress(OSError):
                self.address.path.unlink()

    def request_capture(self, request: CaptureRequest) -> concurrent.futures.Future[CaptureResult]:
        """Relay a capture request to its rank from any thread; the future holds the rank's answer."""
        return self.captures.request_from_thread(request, self._loop)

    def notify_findings(self, run_id: str, findings: tuple[FindingBrief, ...]) -> None:
        """Tell the run's connected ranks the findings shown for it now (they log them); any thread."""
        self.captures.notify_findings_from_thread(run_id, findings, self._loop)

    def _ssl_context(self) -> Any:
        if not (self.address.is_tcp and self.security.tls_server):
            return None
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(self.security.tls_cert, self.security.tls_key or None)
        except (OSError, ssl.SSLError) as exc:
            raise AddressError(f"cannot load the TLS certificate {self.security.tls_cert}: {exc}") from None
        return context

    def _bind(self) -> socket.socket:
        address = self.address
        if address.is_tcp:
            family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address.host, address.port))
            except OSError as exc:
                sock.close()
                raise AddressError(f"cannot listen on {address}: {exc.strerror}") from None
        else:
            assert address.path is not None
            if address.path == default_socket_path():
                ensure_private_dir(address.path.parent)
            else:
                address.path.parent.mkdir(parents=True, exist_ok=True)
            if address.path.exists():
                if _unix_socket_answers(str(address.path)):
                    raise AddressError(
                        f"another gputop is already listening on {address.path}; "
                        "attach to a run with --port N, or stop the other one"
                    )
                address.path.unlink()  # left behind by a dashboard that was killed
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind(str(address.path))
                os.chmod(address.path, 0o600)
            except OSError as exc:
                sock.close()
                raise AddressError(f"cannot listen on {address.path}: {exc.strerror}") from None
        sock.listen(256)
        sock.setblocking(False)
        return sock

    def _serve_forever(self) -> None:
        name_this_thread("gputop-collector")
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            if self.address.is_tcp:
                start = asyncio.start_server(self._handle, sock=self._sock, limit=MAX_FRAME_BYTES, ssl=self._ssl)
            else:
                start = asyncio.start_unix_server(self._handle, sock=self._sock, limit=MAX_FRAME_BYTES)
            self._server = loop.run_until_complete(start)
            self._ready.set()
            loop.run_forever()
        finally:
            self._ready.set()
            with contextlib.suppress(Exception):
                if self._server is not None:
                    self._server.close()
                tasks = asyncio.all_tasks(loop)
                for task in tasks:
                    task.cancel()
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer_name(writer)
        ranks: dict[tuple[str, int], int] = {}  # (run_id, rank) -> pid of its hello on this connection
        reason = "connection closed"
        pending = b""  # the start of a frame whose newline has not arrived yet
        try:
            if self.address.is_tcp and not await self._admit(reader, writer, peer):
                return
            while True:
                # Whole chunks, not a readuntil per frame: a reporter's backlog arrives as
                # hundreds of frames at once, and they are checked and stored as one batch.
                try:
                    chunk = await reader.read(READ_CHUNK_BYTES)
                except ConnectionError:
                    break
                if not chunk:
                    if pending.strip():
                        reason = "connection closed mid-frame"
                    break
                *frames, pending = (pending + chunk).split(b"\n")
                if not ranks and frames and is_capture_request(frames[0]):
                    reason = await self.captures.serve_client(frames[0], writer)
                    break
                if len(pending) > MAX_FRAME_BYTES:
                    reason = self._reject(peer, f"frame over {MAX_FRAME_BYTES} bytes")
                    break
                accepted, gpus, problem = self._accept(frames, ranks)
                self.captures.connected(ranks, writer, accepted)
                now = time.time()
                self.store.ingest_many(accepted, now)
                for sample in gpus:
                    self.store.add_node_gpu(sample)
                if self.on_message is not None:
                    for message in accepted:
                        self.on_message(message, now)
                if any(isinstance(m, Bye) for m in accepted):
                    reason = "finished"
                if problem:
                    reason = self._reject(peer, problem)
                    break
        except asyncio.CancelledError:
            # The dashboard is stopping; ending quietly keeps asyncio from
            # logging every open connection's cancellation as an error.
            reason = "dashboard stopped"
        except Exception as exc:  # a bug in a listener must cost one connection, not the collector
            reason = self._reject(peer, f"internal error: {type(exc).__name__}: {exc}")
        finally:
            for (run_id, rank), pid in ranks.items():
                self.captures.gone((run_id, rank), writer, reason)
                self.store.disconnected(run_id, rank, reason, pid)
                if self.on_disconnect is not None:
                    with contextlib.suppress(Exception):
                        self.on_disconnect(run_id, rank, reason, time.time(), pid)
            with contextlib.suppress(Exception):
                writer.close()

    async def _admit(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str) -> bool:
        """The token handshake: challenge, check the reporter's proof, prove ours; False when refused."""
        token = self.security.token
        challenge = auth.Challenge(nonce=auth.new_nonce(), token=bool(token))
        writer.write(auth.encode_frame(challenge))
        if not token:
            return True  # frames follow at once; nothing to check
        why = ""
        try:
            line = await asyncio.wait_for(reader.readline(), AUTH_TIMEOUT_S)
            reply = auth.decode_frame(line)
        except (asyncio.TimeoutError, asyncio.LimitOverrunError, ValueError, ConnectionError):
            why = "no answer to the token challenge"
        except auth.HandshakeError:
            why = "missing token"
        else:
            if not isinstance(reply, auth.Auth):
                why = "missing token"
            elif not auth.verify(token, "reporter", challenge.nonce, reply.nonce, reply.mac):
                why = "wrong token"
        if why:
            with contextlib.suppress(Exception):
                writer.write(auth.encode_frame(auth.Refused(reason=why)))
                await writer.drain()
            self._reject(peer, why)
            self.store.refused_token()
            return False
        assert isinstance(reply, auth.Auth)
        writer.write(auth.encode_frame(auth.Welcome(mac=auth.mac(token, "collector", challenge.nonce, reply.nonce))))
        return True

    @staticmethod
    def _accept(frames: list[bytes], ranks: dict[tuple[str, int], int]) -> tuple[list[Message], list[GpuSample], str]:
        """The valid messages and node GPU samples of a batch, up to the first bad frame, and what was wrong with it.

        A node's sample is stamped with the receive time (one clock for every host).
        """
        accepted: list[Message] = []
        gpus: list[GpuSample] = []
        for frame in frames:
            if not frame or frame.isspace():
                continue
            if len(frame) > MAX_FRAME_BYTES:
                return accepted, gpus, f"frame over {MAX_FRAME_BYTES} bytes"
            try:
                message = decode_upstream(frame)
                if isinstance(message, Gpus):
                    gpus.append(gpu_sample_from_wire(message.sample, hostname=message.hostname, t=time.time()))
                    continue
            except (ProtocolError, ValueError) as exc:
                return accepted, gpus, str(exc)
            key = (message.run_id, message.rank)
            if isinstance(message, Hello):
                if key not in ranks and len(ranks) >= MAX_RANKS_PER_CONNECTION:
                    return accepted, gpus, f"more than {MAX_RANKS_PER_CONNECTION} ranks on one connection"
                ranks[key] = message.pid
            elif key not in ranks:
                return accepted, gpus, f"{message.TYPE} before hello"
            accepted.append(message)
        return accepted, gpus, ""

    def _reject(self, peer: str, why: str) -> str:
        text = f"closed connection from {peer}: {why}"
        log.warning(text)
        self.store.rejected(text)
        return f"rejected: {why}"


def _peer_name(writer: asyncio.StreamWriter) -> str:
    peer: Any = writer.get_extra_info("peername")
    if isinstance(peer, tuple):
        return f"{peer[0]}:{peer[1]}"
    return "local socket"


def _unix_socket_answers(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(0.5)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()
