"""One collector connection, fed as the event loop feeds it: frames split anywhere, batched, bad, too big.

The ``Connection`` protocol is driven the way asyncio's selector loop drives
it (``get_buffer``, the bytes copied in, ``buffer_updated``), over a transport
that keeps what is written, so every split of a stream can be tried without a
socket.  The real sockets are in ``tests/unit/test_collector.py``.
"""

from __future__ import annotations

import pytest

from gputop import auth
from gputop.collect.capture_relay import CaptureRelay
from gputop.collect.connection import Connection, Intake
from gputop.collect.store import Store
from gputop.model.snapshot import LIVE, LOST
from gputop.protocol import MAX_FRAME_BYTES, Hello, Window, encode
from tests.support.connections import KeptTransport, feed

NOW = 1000.0


def hello(rank: int = 0) -> bytes:
    return encode(Hello(run_id="job", rank=rank, world_size=2, pid=1000 + rank))


def window(seq: int, rank: int = 0) -> bytes:
    return encode(
        Window(run_id="job", rank=rank, seq=seq, t0=seq * 0.5, t1=seq * 0.5 + 0.5, steps=5, step_total=5 * seq)
    )


def open_connection(intake: Intake) -> tuple[Connection, KeptTransport]:
    connection, transport = Connection(intake), KeptTransport()
    connection.connection_made(transport)
    return connection, transport


def unix_intake(store: Store) -> Intake:
    """A Unix socket's connections: no handshake."""
    return Intake(store=store, captures=CaptureRelay(), greet=False, token="")


def seqs(store: Store, rank: int = 0) -> list[int]:
    views = {v.rank: v for v in store.snapshot(NOW).all_ranks()}
    return [w.seq for w in views[rank].windows] if rank in views else []


STREAM = hello() + window(1) + window(2) + window(3)


class TestFramesAcrossReads:
    """A frame is taken once its newline arrives, however the bytes were cut."""

    def test_a_stream_cut_in_two_at_every_byte(self) -> None:
        for cut in range(1, len(STREAM)):
            store = Store()
            connection, transport = open_connection(unix_intake(store))
            feed(connection, STREAM[:cut], STREAM[cut:])
            assert seqs(store) == [1, 2, 3], f"cut at byte {cut}"
            assert not transport.closed and store.snapshot(NOW).rejected == ()

    def test_a_stream_one_byte_a_read(self) -> None:
        store = Store()
        connection, transport = open_connection(unix_intake(store))
        feed(connection, *(STREAM[i : i + 1] for i in range(len(STREAM))))
        assert seqs(store) == [1, 2, 3] and not transport.closed

    def test_a_backlog_of_hundreds_of_frames_in_one_read(self) -> None:
        store = Store(history_windows=None)
        backlog = hello() + b"".join(window(seq) for seq in range(1, 601))
        connection, _ = open_connection(unix_intake(store))
        feed(connection, backlog)
        assert seqs(store) == list(range(1, 601))

    def test_a_frame_waiting_for_its_newline_is_not_taken_yet(self) -> None:
        store = Store()
        connection, _ = open_connection(unix_intake(store))
        feed(connection, hello() + window(1) + window(2)[:-1])
        assert seqs(store) == [1]
        feed(connection, b"\n")
        assert seqs(store) == [1, 2]


class TestBadFrames:
    """A bad frame closes its own connection, after what came before it, and no other."""

    def test_a_malformed_frame_mid_read_keeps_the_frames_before_it_and_spares_other_connections(self) -> None:
        store = Store()
        intake = unix_intake(store)
        good, good_transport = open_connection(intake)
        bad, bad_transport = open_connection(intake)
        feed(good, hello(rank=0) + window(1, rank=0))
        feed(bad, hello(rank=1) + window(1, rank=1) + b"this is not json\n" + window(2, rank=1))
        assert bad_transport.closed and seqs(store, rank=1) == [1]
        feed(bad, window(3, rank=1))  # TLS may hand over what it had decrypted: ignored
        assert seqs(store, rank=1) == [1]
        feed(good, window(2, rank=0))
        assert not good_transport.closed and seqs(store, rank=0) == [1, 2]
        views = {v.rank: v for v in store.snapshot(NOW).all_ranks()}
        assert views[0].status == LIVE
        assert views[1].status == LOST and "not JSON" in views[1].status_reason

    def test_a_frame_of_exactly_the_limit_is_taken_across_reads(self) -> None:
        store = Store()
        connection, transport = open_connection(unix_intake(store))
        frame = padded(window(1), MAX_FRAME_BYTES)
        feed(connection, hello(), frame[:30000], frame[30000:-1])  # the whole frame but its newline
        assert not transport.closed
        feed(connection, b"\n")
        assert seqs(store) == [1] and not transport.closed

    def test_one_byte_over_the_limit_closes_before_its_newline_arrives(self) -> None:
        store = Store()
        connection, transport = open_connection(unix_intake(store))
        frame = padded(window(1), MAX_FRAME_BYTES + 1)
        feed(connection, hello(), frame[:30000], frame[30000:60000])
        assert not transport.closed  # 60,000 bytes so far: it may still be a frame
        feed(connection, frame[60000:-1])  # all but the newline: past the limit
        assert transport.closed
        assert any(f"frame over {MAX_FRAME_BYTES} bytes" in r for r in store.snapshot(NOW).rejected)


def padded(frame: bytes, length: int) -> bytes:
    """``frame`` with blanks after its opening brace, ``length`` bytes before its newline (still valid JSON)."""
    body = frame.rstrip(b"\n")
    return b"{" + b" " * (length - len(body)) + body[1:] + b"\n"


@pytest.mark.parametrize("step", [1, 7, 40])
async def test_the_token_handshake_cut_anywhere_admits_the_reporter_and_keeps_its_frames(step: int) -> None:
    """The reporter's proof and its first frames may share a read or straddle several."""
    store = Store()
    intake = Intake(store=store, captures=CaptureRelay(), greet=True, token="secret")
    connection, transport = open_connection(intake)
    challenge = auth.decode_frame(bytes(transport.written).split(b"\n")[0])
    assert isinstance(challenge, auth.Challenge) and challenge.token
    stream = auth.encode_frame(auth.answer(challenge, "secret")) + STREAM
    feed(connection, *(stream[i : i + step] for i in range(0, len(stream), step)))
    assert seqs(store) == [1, 2, 3] and not transport.closed
    assert b'"welcome"' in transport.written and store.token_refusals == 0
    connection.connection_lost(None)


async def test_a_wrong_proof_is_refused_and_nothing_after_it_is_read() -> None:
    store = Store()
    intake = Intake(store=store, captures=CaptureRelay(), greet=True, token="secret")
    connection, transport = open_connection(intake)
    challenge = auth.decode_frame(bytes(transport.written).split(b"\n")[0])
    assert isinstance(challenge, auth.Challenge)
    feed(connection, auth.encode_frame(auth.answer(challenge, "guess")) + STREAM)
    assert transport.closed and b"wrong token" in transport.written
    assert store.snapshot(NOW).runs == () and store.token_refusals == 1
