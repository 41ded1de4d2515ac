"""One connection to the collector, as an asyncio protocol: frames in, commands out.

A connection is a reporter's (a hello, then windows and events), a node
sampler's (``gpus`` frames, no hello) or a ``gputop capture`` client's (one
request, answered, then closed).  On TCP it first passes the token handshake
of ``gputop.auth``.  A malformed, oversized or wrong-version frame closes that
one connection with a logged reason and never the collector.

Why a protocol and not asyncio's streams: at 1,024 ranks the collector takes
about 2,000 reads a second of a frame or two (~400 bytes) each.  A stream read
paid for a ``StreamReader``, a future set and a task resumed per read, and for
a 256-KiB ``bytes`` that ``recv`` allocated and shrank (a fresh mapping from
glibc each time, at that size): ~40 of the ~50 µs a window cost.  Here the
event loop reads straight into one buffer all connections share (the
collector's loop handles one read at a time, start to end, on its thread), and
the frames are split, checked and stored in the same callback.

Commands to a rank (``CaptureRelay``) are written without waiting.  A reporter
reads its socket on every pump, so its commands only pile up when it stopped
reading; beyond ``MAX_QUEUED_DOWN_BYTES`` queued here (on top of what the
kernel holds) commands to it are dropped, so a rank that never reads cannot
make the dashboard buffer without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gputop import auth
from gputop.collect.capture_relay import CaptureRelay, RankKey, is_capture_request
from gputop.collect.store import Store
from gputop.model.samples import GpuSample, gpu_sample_from_wire
from gputop.protocol import (
    MAX_FRAME_BYTES,
    OPTIONAL_TYPES,
    Accepts,
    Bye,
    Gpus,
    Hello,
    Message,
    ProtocolError,
    decode_upstream,
    encode,
)

log = logging.getLogger("gputop.collector")

# Called on the collector thread with each accepted message and its receive time.
MessageListener = Callable[[Message, float], None]
# Called on the collector thread when a rank's connection ends: run_id, rank, reason, time, pid.
DisconnectListener = Callable[[str, int, str, float, int], None]
# A reporter speaks for one rank (two while it learns its real name); more is a misbehaving peer.
MAX_RANKS_PER_CONNECTION = 8
READ_BUFFER_BYTES = 256 * 1024  # a reporter's backlog arrives in reads this size, checked and stored as one batch
AUTH_TIMEOUT_S = 10.0  # a reporter answers a challenge in one round trip
# Commands queued for one rank beyond the kernel's buffer: a dozen findings notices.  Past it the
# connection is paused for writing: findings notices to the rank are dropped (it is told the current
# ones when it catches up) and capture requests are refused.
MAX_QUEUED_DOWN_BYTES = 16 * 1024


@dataclass
class Intake:
    """What the connections of one collector share: where their messages go, and the read buffer."""

    store: Store
    captures: CaptureRelay
    greet: bool  # TCP: every connection opens with the handshake's challenge (a Unix socket has none)
    token: str  # "" when the challenge asks for none
    on_message: MessageListener | None = None
    on_disconnect: DisconnectListener | None = None
    connections: set[Connection] = field(default_factory=set)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # capture clients waiting for their answer
    # One buffer for every connection's reads: the selector loop fills it and hands it over in one call.
    # A memoryview, not the bytearray: TLS reads into slices of it, and a bytearray's slice is a copy.
    read_buffer: memoryview = field(default_factory=lambda: memoryview(bytearray(READ_BUFFER_BYTES)))


class Connection(asyncio.BufferedProtocol):
    """One peer of the collector, from its first byte to its close.

    Goes through at most two of three states: the token handshake (TCP with a
    token), then frames (a reporter or a node sampler), or one capture request.
    """

    def __init__(self, intake: Intake) -> None:
        self._intake = intake
        self._transport: asyncio.Transport | None = None
        self.peer = "local socket"
        self.ranks: dict[RankKey, int] = {}  # (run_id, rank) -> pid of its hello on this connection
        self._pending = b""  # the start of a frame whose newline has not arrived yet
        self._challenge: auth.Challenge | None = None  # set while the reporter's answer is awaited
        self._auth_timer: asyncio.TimerHandle | None = None
        self._capturing = False  # a capture client: its request is being answered
        self._reason = "connection closed"
        self._ended = False
        self._writing_paused = False
        self._dropped_down = False  # a command to this rank was dropped while writing was paused

    # -- asyncio's calls ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.set_write_buffer_limits(high=MAX_QUEUED_DOWN_BYTES)
        self.peer = _peer_name(transport)
        self._intake.connections.add(self)
        if self._intake.greet:
            self._greet()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._intake.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self._ended:
            return  # closed on an earlier frame; TLS may still hand over what it had decrypted
        try:
            self._received(self._intake.read_buffer[:nbytes])
        except Exception as exc:  # a bug in a listener must cost one connection, not the collector
            self.close(self._reject(f"internal error: {type(exc).__name__}: {exc}"))

    def eof_received(self) -> bool | None:
        if self._challenge is not None:
            self._refuse("missing token")  # a reporter without a token hangs up at the challenge
        elif self._pending.strip():
            self._reason = "connection closed mid-frame"
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self._challenge is not None:
            self._reject("no answer to the token challenge")
            self._intake.store.refused_token()
        self._cancel_auth_timer()
        self._end()
        self._intake.connections.discard(self)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._dropped_down:
            self._dropped_down = False
            self._intake.captures.caught_up(self.ranks, self)

    # -- the downlink (CaptureRelay's side) -------------------------------------------------------

    def send(self, frame: bytes) -> bool:
        """Queue a command for the rank without waiting; False when it was dropped (closing, or not reading)."""
        transport = self._transport
        if transport is None or transport.is_closing() or self._ended:
            return False
        if self._writing_paused:
            self._dropped_down = True
            return False
        transport.write(frame)
        return True

    # -- ending ---------------------------------------------------------------------------------

    def close(self, reason: str) -> None:
        """End the connection for ``reason``: its ranks are marked gone now; what is queued for it is still sent."""
        self._reason = reason
        self._end()
        if self._transport is not None:
            self._transport.close()

    def abort(self, reason: str) -> None:
        """End the connection at once, dropping what is queued (the collector is stopping)."""
        self._reason = reason
        self._end()
        if self._transport is not None:
            self._transport.abort()

    def _end(self) -> None:
        """Tell the store, the relay and the listener that this connection's ranks are gone; once."""
        if self._ended:
            return
        self._ended = True
        self._challenge = None
        intake = self._intake
        for (run_id, rank), pid in self.ranks.items():
            intake.captures.gone((run_id, rank), self, self._reason)
            intake.store.disconnected(run_id, rank, self._reason, pid)
            if intake.on_disconnect is not None:
                with contextlib.suppress(Exception):
                    intake.on_disconnect(run_id, rank, self._reason, time.time(), pid)

    # -- frames ---------------------------------------------------------------------------------

    def _received(self, data: memoryview) -> None:
        """Split a read into whole frames (the tail waits for its newline) and hand them on by state."""
        *frames, self._pending = (self._pending + data).split(b"\n")
        if self._challenge is not None:
            if not frames:
                if len(self._pending) > auth.MAX_HANDSHAKE_LINE_BYTES:
                    self._refuse("missing token")
                return
            if not self._admit(frames.pop(0)):
                return
        if self._capturing:
            return  # a capture client sends its request and waits; anything after it is ignored
        if frames and not self.ranks and is_capture_request(frames[0]):
            self._answer_capture(frames[0])
            return
        if frames:
            self._take(frames)
        if not self._ended and len(self._pending) > MAX_FRAME_BYTES:
            self.close(self._reject(f"frame over {MAX_FRAME_BYTES} bytes"))

    def _take(self, frames: list[bytes]) -> None:
        """Store a batch of frames, up to the first bad one, which closes the connection."""
        intake = self._intake
        accepted, gpus, problem = accept(frames, self.ranks)
        intake.captures.connected(self.ranks, self, accepted)
        now = time.time()
        intake.store.ingest_many(accepted, now)
        for sample in gpus:
            intake.store.add_node_gpu(sample)
        if intake.on_message is not None:
            for message in accepted:
                intake.on_message(message, now)
        for message in accepted:
            if isinstance(message, Hello) and message.sends:
                self._accept_optional(message)
        if any(isinstance(m, Bye) for m in accepted):
            self._reason = "finished"
        if problem:
            self.close(self._reject(problem))

    def _accept_optional(self, hello: Hello) -> None:
        """Tell a rank which of the optional types its hello offers this collector reads (``Accepts``).

        A reporter sends an optional type only after hearing this on the same
        connection: a collector from before that type would close on it.
        """
        types = tuple(t for t in hello.sends if t in OPTIONAL_TYPES)
        if types:
            self.send(encode(Accepts(run_id=hello.run_id, rank=hello.rank, types=types)))

    def _answer_capture(self, frame: bytes) -> None:
        """A ``gputop capture`` client: relay its request, write the rank's answer, then close."""
        self._capturing = True
        assert self._transport is not None
        self._transport.pause_reading()
        task = asyncio.get_running_loop().create_task(self._capture_answered(frame))
        self._intake.tasks.add(task)
        task.add_done_callback(self._intake.tasks.discard)

    async def _capture_answered(self, frame: bytes) -> None:
        answer = await self._intake.captures.answer(frame)
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(encode(answer))
        self.close("capture answered")

    def _reject(self, why: str) -> str:
        text = f"closed connection from {self.peer}: {why}"
        log.warning(text)
        self._intake.store.rejected(text)
        return f"rejected: {why}"

    # -- the token handshake --------------------------------------------------------------------

    def _greet(self) -> None:
        """Send the challenge; with a token, wait for the reporter's proof before reading frames."""
        token = self._intake.token
        challenge = auth.Challenge(nonce=auth.new_nonce(), token=bool(token))
        assert self._transport is not None
        self._transport.write(auth.encode_frame(challenge))
        if token:  # without one, frames follow at once: nothing to check
            self._challenge = challenge
            self._auth_timer = asyncio.get_running_loop().call_later(AUTH_TIMEOUT_S, self._auth_timed_out)

    def _admit(self, line: bytes) -> bool:
        """Check the reporter's answer to the challenge: welcome it (True) or refuse it and close."""
        challenge, token = self._challenge, self._intake.token
        assert challenge is not None
        try:
            reply: auth.HandshakeFrame | None = auth.decode_frame(line)
        except auth.HandshakeError:
            reply = None
        if not isinstance(reply, auth.Auth):
            self._refuse("missing token")
            return False
        if not auth.verify(token, "reporter", challenge.nonce, reply.nonce, reply.mac):
            self._refuse("wrong token")
            return False
        self._challenge = None
        self._cancel_auth_timer()
        assert self._transport is not None
        proof = auth.mac(token, "collector", challenge.nonce, reply.nonce)
        self._transport.write(auth.encode_frame(auth.Welcome(mac=proof)))
        return True

    def _refuse(self, why: str) -> None:
        """Say why to the peer, count the refusal, close."""
        self._challenge = None
        self._cancel_auth_timer()
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(auth.encode_frame(auth.Refused(reason=why)))
        reason = self._reject(why)
        self._intake.store.refused_token()
        self.close(reason)

    def _auth_timed_out(self) -> None:
        self._auth_timer = None
        if self._challenge is not None:
            self._refuse("no answer to the token challenge")

    def _cancel_auth_timer(self) -> None:
        if self._auth_timer is not None:
            self._auth_timer.cancel()
            self._auth_timer = None


def accept(frames: list[bytes], ranks: dict[RankKey, int]) -> tuple[list[Message], list[GpuSample], str]:
    """The valid messages and node GPU samples of a batch, up to the first bad frame, and what was wrong with it.

    ``ranks`` (the connection's, from its hellos) gains each new hello's rank.
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


def _peer_name(transport: asyncio.BaseTransport) -> str:
    peer: Any = transport.get_extra_info("peername")
    if isinstance(peer, tuple):
        return f"{peer[0]}:{peer[1]}"
    return "local socket"
