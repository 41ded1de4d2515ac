"""The collector: an asyncio server, on its own thread, that reporters connect to.

Many reporters from many runs; each connection starts with a hello and then
streams windows.  A node sampler's connection (``gputop.node``) sends ``gpus``
frames instead, one host's NVML readings a second, and needs no hello.  What
happens on one connection (the token handshake of ``gputop.auth``, inside TLS
when a certificate is given; frames split, checked and stored; a bad frame
closing it) is ``gputop.collect.connection``'s.  The listening socket is bound
in ``start()`` on the caller's thread, so "address in use" is an ordinary
exception the CLI can turn into one line; a listener off loopback refuses to
start without a token.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import socket
import threading
from typing import TYPE_CHECKING

from gputop import auth
from gputop.address import Address, AddressError, default_socket_path, ensure_private_dir
from gputop.collect.capture_relay import CaptureRelay
from gputop.collect.connection import Connection, DisconnectListener, Intake, MessageListener
from gputop.collect.store import Store
from gputop.processes.procfs import name_this_thread
from gputop.protocol import CaptureRequest, CaptureResult, FindingBrief

if TYPE_CHECKING:
    import ssl


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
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self.captures = CaptureRelay()  # profiler capture requests down to ranks, results back
        self._ssl: ssl.SSLContext | None = None
        self._intake = Intake(
            store=store,
            captures=self.captures,
            greet=address.is_tcp,
            token=self.security.token,
            on_message=on_message,
            on_disconnect=on_disconnect,
        )

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

    def _ssl_context(self) -> ssl.SSLContext | None:
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
        # A selector loop on every platform: the connections share one read buffer, which asks for a
        # loop that fills it and hands it over in one call (a proactor loop reads into it later).
        loop = asyncio.SelectorEventLoop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(self._listen(loop))
            self._ready.set()
            loop.run_forever()
        finally:
            self._ready.set()
            with contextlib.suppress(Exception):
                self._close_all(loop)
            loop.close()

    def _close_all(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop listening and end every connection: its ranks are gone ("dashboard stopped"), its socket closed."""
        if self._server is not None:
            self._server.close()
        for connection in list(self._intake.connections):
            connection.abort("dashboard stopped")
        for task in asyncio.all_tasks(loop):
            task.cancel()  # capture clients waiting for an answer
        loop.run_until_complete(_settle())

    async def _listen(self, loop: asyncio.AbstractEventLoop) -> asyncio.base_events.Server:
        """Serve the socket ``start()`` bound: a ``Connection`` for each peer."""
        intake, sock = self._intake, self._sock
        assert sock is not None
        if self.address.is_tcp:
            return await loop.create_server(lambda: Connection(intake), sock=sock, ssl=self._ssl)
        return await loop.create_unix_server(lambda: Connection(intake), sock=sock)


async def _settle() -> None:
    """Let cancelled tasks finish and aborted transports close their sockets (each in a callback of its own)."""
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    await asyncio.gather(*others, return_exceptions=True)
    await asyncio.sleep(0)  # TLS: the app's connection_lost comes one callback after the socket's


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
