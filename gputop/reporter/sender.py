"""The reporter's link to the dashboard: a non-blocking socket and a bounded backlog.

Runs on the reporter thread only.  Frames wait in ``backlog`` until a dashboard
is connected; when the backlog is full the oldest frame is dropped and counted.
The socket is non-blocking: a slow or frozen dashboard fills the kernel buffer,
``send`` stops making progress, frames pile up in the backlog and the oldest are
dropped — the reporter never waits.  After a reconnect the latest hello goes
first, then the backlog, so a dashboard started late still sees the history.

Over TCP a connection opens with the token handshake (``gputop.auth``), done
blocking with a short timeout on the reporter thread (never the training
thread) before the socket turns non-blocking; optionally inside TLS.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import select
import socket
import time
from collections import deque

from gputop import auth
from gputop.address import Address, default_socket_path, private_dir_problem
from gputop.protocol import MAX_FRAME_BYTES

BACKOFF_MIN_S = 0.25
BACKOFF_MAX_S = 5.0
CONNECT_TIMEOUT_S = 0.2  # loopback or a local socket answers in microseconds
HANDSHAKE_TIMEOUT_S = 2.0  # a remote collector's challenge and verdict: one round trip each, plus TLS
REFUSED_BACKOFF_S = 30.0  # a collector that refused our token will refuse it again soon
MAX_INFLIGHT_BYTES = 256 * 1024  # taken from the backlog per pump, ahead of the kernel


class Sender:
    """Owns the connection; ``enqueue`` frames, call ``pump`` often."""

    def __init__(self, address: Address, *, backlog_frames: int, security: auth.Security | None = None) -> None:
        self.address = address
        self.security = security if security is not None else auth.Security.from_env()
        self.backlog: deque[bytes] = deque()
        self.backlog_frames = backlog_frames
        self.dropped = 0  # frames dropped because the backlog was full
        self.connects = 0
        self.sent_bytes = 0  # written to a socket, over the reporter's life
        self.refused = ""  # why we may not report there (socket folder not ours, token refused), once seen
        # Whether the last connection reached another machine (TCP, ends on different non-loopback
        # addresses); None before any connection.  Decides whether this host's node sampler starts.
        self.remote_link: bool | None = None
        self.hello = b""
        self._sock: socket.socket | None = None
        self._inflight: deque[bytes] = deque()  # taken from the backlog, not yet fully sent
        self._inflight_bytes = 0
        self._offset = 0  # bytes of _inflight[0] already sent
        self._next_attempt_s = 0.0
        self._backoff_s = BACKOFF_MIN_S
        self._downstream = b""  # the start of a command frame from the dashboard, newline not yet seen

    @property
    def connected(self) -> bool:
        return self._sock is not None

    @property
    def idle(self) -> bool:
        """Nothing left to send."""
        return not self.backlog and not self._inflight

    def set_hello(self, frame: bytes) -> None:
        """The hello to send first on every connection; sent now too if connected."""
        self.hello = frame
        if self._sock is not None:
            self.enqueue(frame)

    def forget_queued(self) -> None:
        """Drop every frame not yet sent (they were made under a name the next hello replaces)."""
        self.backlog.clear()
        self._inflight.clear()
        self._inflight_bytes = self._offset = 0

    def enqueue(self, frame: bytes, *, this_connection_only: bool = False) -> None:
        """Queue a frame; ``this_connection_only``: dropped now when not connected, and never sent after a reconnect.

        Such a frame was meant for the collector connected now (it said it
        accepts its type); the next connection may be another collector.
        """
        if this_connection_only:
            if self._sock is None:
                return
            frame = _ThisConnection(frame)
        if len(self.backlog) >= self.backlog_frames:
            self.backlog.popleft()
            self.dropped += 1
        self.backlog.append(frame)

    def pump(self, now_s: float | None = None) -> None:
        """Connect if due, then send as much as the socket takes without blocking."""
        now_s = time.monotonic() if now_s is None else now_s
        if self._sock is None and (now_s < self._next_attempt_s or not self._connect(now_s)):
            return
        while self.backlog and self._inflight_bytes < MAX_INFLIGHT_BYTES:
            frame = self.backlog.popleft()
            self._inflight.append(frame)
            self._inflight_bytes += len(frame)
        self._send()

    def read_commands(self) -> list[bytes]:
        """Frames the dashboard sent down this connection (capture requests), without blocking.

        Only whole lines are returned; parsing and checking them is the
        caller's business.  A line longer than a frame may be is discarded.
        """
        sock = self._sock
        if sock is None:
            return []
        while True:
            try:
                chunk = sock.recv(MAX_FRAME_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.close()
                break
            if not chunk:  # the dashboard closed the connection; sending will notice and reconnect
                break
            self._downstream += chunk
            if len(self._downstream) > 2 * MAX_FRAME_BYTES and b"\n" not in self._downstream:
                self._downstream = b""
        *frames, self._downstream = self._downstream.split(b"\n")
        return [f for f in frames if f.strip() and len(f) <= MAX_FRAME_BYTES]

    def close(self, linger_s: float = 0.0) -> None:
        """Close the connection; with ``linger_s``, hang up the way TCP means it first.

        Closing a socket with bytes unread (a findings notice the dashboard sent
        after our last read) makes the kernel reset the connection, and a reset
        throws away what it had not sent yet: at exit, the last window and the
        bye when the dashboard is slow to read.  So at exit: say we are done
        sending (a FIN after the queued bytes), then read and drop what the
        dashboard still sends until it hangs up too, for at most ``linger_s``.
        """
        self._downstream = b""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if linger_s > 0:
                sock.shutdown(socket.SHUT_WR)
                deadline = time.monotonic() + linger_s
                while (left := deadline - time.monotonic()) > 0:
                    readable, _, _ = select.select([sock], [], [], left)
                    if readable and not _recv_some(sock):
                        break  # the dashboard read everything and hung up
        with contextlib.suppress(OSError):
            sock.close()

    def _connect(self, now_s: float) -> bool:
        try:
            if self.address.is_tcp:
                sock = socket.create_connection(self.address.tcp_endpoint, timeout=CONNECT_TIMEOUT_S)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock = self._secure(sock)
                self.remote_link = _ends_differ(sock)
            else:
                path = self.address.path
                assert path is not None
                # Another user who made the default folder first must not get our telemetry.
                problem = private_dir_problem(path.parent) if path == default_socket_path() else None
                if problem is not None:
                    self.refused = problem if path.parent.exists() else ""
                    raise FileNotFoundError(problem)
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(CONNECT_TIMEOUT_S)
                sock.connect(str(self.address.path))
            sock.setblocking(False)
        except OSError:
            self._next_attempt_s = now_s + self._backoff_s
            self._backoff_s = min(self._backoff_s * 2, BACKOFF_MAX_S)
            return False
        self._sock = sock
        self.connects += 1
        self._backoff_s = BACKOFF_MIN_S
        # Frames cut off by the last connection's end go again: the collector
        # drops windows it has already seen by their sequence number.
        if any(isinstance(frame, _ThisConnection) for frame in self.backlog):
            self.backlog = deque(frame for frame in self.backlog if not isinstance(frame, _ThisConnection))
        for frame in reversed(self._inflight):
            if not isinstance(frame, _ThisConnection):
                self.backlog.appendleft(frame)
        self._inflight.clear()
        self._inflight_bytes = self._offset = 0
        if self.hello:
            self.backlog.appendleft(self.hello)
        return True

    def _secure(self, sock: socket.socket) -> socket.socket:
        """TLS if configured, then the token handshake; raises OSError when refused."""
        sock.settimeout(HANDSHAKE_TIMEOUT_S)
        if self.security.tls_ca:
            import ssl  # only reporters that use TLS pay for loading it

            global _WOULD_BLOCK
            _WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
        try:
            sock, refusal = auth.secure_client(sock, self.security, self.address.host, str(self.address))
        except auth.HandshakeError as exc:
            refusal = f"{self.address} is not a gputop collector that speaks this version ({exc})"
        if refusal:
            sock.close()
            self.refused = refusal
            self._backoff_s = REFUSED_BACKOFF_S
            raise ConnectionRefusedError(refusal)
        return sock

    def _send(self) -> None:
        sock = self._sock
        while sock is not None and self._inflight:
            frame = self._inflight[0]
            try:
                sent = sock.send(memoryview(frame)[self._offset :])
            except _WOULD_BLOCK:
                return  # kernel buffer full: the dashboard is slow; try next pump
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                self.close()
                return
            self._offset += sent
            self.sent_bytes += sent
            if self._offset >= len(frame):
                self._inflight.popleft()
                self._inflight_bytes -= len(frame)
                self._offset = 0


class _ThisConnection(bytes):
    """A frame queued for the connection open at the time: left out when a new connection takes the backlog."""


def _ends_differ(sock: socket.socket) -> bool:
    """Whether a TCP connection's two ends are different, non-loopback addresses: another machine."""
    try:
        own, peer = sock.getsockname()[0], sock.getpeername()[0]
        return own != peer and not ipaddress.ip_address(peer.split("%")[0]).is_loopback
    except (OSError, ValueError, IndexError, TypeError):
        return False


# What a non-blocking send raises when the kernel buffer is full; ssl's own two
# join once a TLS socket exists (ssl is loaded only then).
_WOULD_BLOCK: tuple[type[Exception], ...] = (BlockingIOError,)


def _recv_some(sock: socket.socket) -> bool:
    """Read and drop what is there; False once the other end has hung up."""
    try:
        return bool(sock.recv(65536))
    except (BlockingIOError, InterruptedError):
        return True
