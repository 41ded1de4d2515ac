"""The reporter's link: backlog, drops, reconnect; it never blocks."""

from __future__ import annotations

import socket
import threading
import time

from gputop.address import Address
from gputop.auth import Challenge, encode_frame
from gputop.collect.server import Collector
from gputop.collect.store import Store
from gputop.protocol import Hello, Window, encode
from gputop.reporter.sender import Sender
from tests.support.collectors import snapshot_of, wait_for, window_count


def frames(n: int, start: int = 1) -> list[bytes]:
    return [
        encode(Window(run_id="r", rank=0, seq=i, t0=i, t1=i + 0.5, steps=1, step_total=i))
        for i in range(start, start + n)
    ]


def test_without_a_dashboard_the_backlog_keeps_the_newest_and_counts_drops() -> None:
    sender = Sender(Address(port=1), backlog_frames=10)  # port 1: nobody listens
    for frame in frames(25):
        sender.enqueue(frame)
        sender.pump()
    assert not sender.connected
    assert len(sender.backlog) == 10 and sender.dropped == 15
    assert sender.backlog[0] == frames(1, start=16)[0]


def test_late_dashboard_gets_hello_then_the_whole_backlog(collector: Collector) -> None:
    sender = Sender(collector.address, backlog_frames=100)
    sender.set_hello(encode(Hello(run_id="r", rank=0)))
    for frame in frames(30):
        sender.enqueue(frame)
    assert wait_for(lambda: (sender.pump(), sender.idle)[1], timeout_s=5)
    assert wait_for(lambda: window_count(collector) == 30)
    sender.close()


def test_frozen_dashboard_costs_drops_not_a_stall() -> None:
    """A listener that admits us, then never reads: pump() keeps returning, the backlog stays bounded."""
    frozen = socket.socket()
    frozen.bind(("127.0.0.1", 0))
    frozen.listen(1)

    def admit_then_freeze() -> None:  # the collector's TCP greeting (no token), then silence
        conn, _ = frozen.accept()
        conn.sendall(encode_frame(Challenge(nonce="00", token=False)))
        held.append(conn)

    held: list[socket.socket] = []
    threading.Thread(target=admit_then_freeze, daemon=True).start()
    sender = Sender(Address(port=frozen.getsockname()[1]), backlog_frames=50)
    sender.set_hello(encode(Hello(run_id="r", rank=0)))
    big = encode(Hello(run_id="r", rank=0, name="x" * 60_000))

    def flood() -> None:
        for _ in range(400):  # ~24 MB: far more than the kernel buffers hold
            sender.enqueue(big)
            sender.pump()

    worker = threading.Thread(target=flood, daemon=True)
    worker.start()
    worker.join(60)  # a blocking send would hang here for good
    assert not worker.is_alive(), "pump() blocked on a socket nobody reads"
    assert sender.connected
    assert len(sender.backlog) <= 50
    assert sender.dropped > 0
    sender.close()
    frozen.close()


def test_reconnects_after_the_dashboard_restarts() -> None:
    first = Collector(Store(), Address(port=0))
    first.start()
    port = first.address.port
    sender = Sender(first.address, backlog_frames=100)
    sender.set_hello(encode(Hello(run_id="r", rank=0)))
    for frame in frames(3):
        sender.enqueue(frame)
    assert wait_for(lambda: (sender.pump(), sender.idle)[1])
    first.stop()
    second = Collector(Store(), Address(port=port))
    second.start()
    try:
        seq = 4

        def more() -> bool:
            nonlocal seq
            sender.enqueue(frames(1, start=seq)[0])
            seq += 1
            sender.pump(time.monotonic() + 10)  # past any backoff
            return window_count(second) > 0

        assert wait_for(more, timeout_s=10, interval_s=0.1)
        assert sender.connects == 2
        assert snapshot_of(second).all_ranks()[0].hello.run_id == "r"
    finally:
        sender.close()
        second.stop()


def test_a_rank_that_connects_after_the_findings_were_told_hears_them(collector: Collector) -> None:
    """The dashboard tells a run's ranks its findings when they change; a rank that comes later still hears."""
    from gputop.protocol import FindingBrief, FindingsNotice, decode_command

    early = Sender(collector.address, backlog_frames=10)
    early.set_hello(encode(Hello(run_id="r", rank=0)))
    early.enqueue(frames(1)[0])
    assert wait_for(lambda: (early.pump(), window_count(collector) == 1)[1], timeout_s=5)
    shown = (FindingBrief(cause="data_loading", severity="warn", title="rank 0 waits for data 42%", ranks=(0,)),)
    collector.notify_findings("r", shown)

    late = Sender(collector.address, backlog_frames=10)  # rank 1 joins (or rank 0 reconnects) afterwards
    late.set_hello(encode(Hello(run_id="r", rank=1)))
    late.enqueue(encode(Window(run_id="r", rank=1, seq=1, t0=1, t1=1.5, steps=1, step_total=1)))
    heard: list[bytes] = []
    assert wait_for(lambda: (late.pump(), heard.extend(late.read_commands()), bool(heard))[2], timeout_s=5), (
        "the late rank heard nothing"
    )
    notice = decode_command(heard[0])
    assert isinstance(notice, FindingsNotice) and notice.rank == 1 and notice.findings == shown, notice

    collector.notify_findings("r", ())  # cleared: a rank that comes after that hears nothing old
    again = Sender(collector.address, backlog_frames=10)
    again.set_hello(encode(Hello(run_id="r", rank=2)))
    again.enqueue(encode(Window(run_id="r", rank=2, seq=1, t0=1, t1=1.5, steps=1, step_total=1)))
    assert wait_for(lambda: (again.pump(), window_count(collector) == 3)[1], timeout_s=5)
    time.sleep(0.3)
    assert again.read_commands() == []
    for sender in (early, late, again):
        sender.close()


def _slow_dashboard() -> tuple[socket.socket, list[tuple[str, int]]]:
    """A listener that admits one rank, sends it a notice it never reads, then reads only after 0.5 s.

    Records how it ended, ("eof" or "reset", bytes read), once the rank has hung up.
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    ended: list[tuple[str, int]] = []

    def serve() -> None:
        conn, _ = listener.accept()
        conn.sendall(encode_frame(Challenge(nonce="00", token=False)) + b'{"type":"findings"}\n')
        time.sleep(0.5)  # busy elsewhere, as a dashboard with a thousand ranks can be
        got = 0
        try:
            while chunk := conn.recv(1 << 16):
                got += len(chunk)
        except ConnectionResetError:
            ended.append(("reset", got))
        else:
            ended.append(("eof", got))
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener, ended


def test_at_exit_what_was_sent_reaches_a_slow_dashboard_with_a_notice_unread() -> None:
    """Closing with bytes unread resets the connection, and a reset drops what the kernel had not sent yet."""
    listener, ended = _slow_dashboard()
    sender = Sender(Address(port=listener.getsockname()[1]), backlog_frames=100)
    big = encode(Hello(run_id="r", rank=0, name="x" * 60_000))
    for _ in range(40):  # 2.4 MB: the kernel takes it all, but cannot send it all before the dashboard reads
        sender.enqueue(big)
    assert wait_for(lambda: (sender.pump(), sender.idle)[1], timeout_s=5), "the kernel would not take 2.4 MB"
    sent = sender.sent_bytes
    sender.close(linger_s=5.0)  # what the reporter does at exit
    assert wait_for(lambda: bool(ended), timeout_s=10)
    assert ended == [("eof", sent)], f"sent {sent} bytes; the dashboard saw {ended}"
    listener.close()
