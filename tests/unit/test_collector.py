"""The collector: many reporters, bad frames close one connection, never the collector."""

from __future__ import annotations

import concurrent.futures
import contextlib
import socket
import time
from pathlib import Path

import pytest

from gputop.address import Address, AddressError
from gputop.collect.capture_relay import ask
from gputop.collect.connection import MAX_QUEUED_DOWN_BYTES, READ_BUFFER_BYTES
from gputop.collect.server import Collector
from gputop.collect.store import Store
from gputop.model.snapshot import DONE, LIVE, LOST
from gputop.protocol import (
    MAX_FRAME_BYTES,
    Bye,
    CaptureRequest,
    CaptureResult,
    FindingBrief,
    FindingsNotice,
    Hello,
    Window,
    decode_command,
    encode,
)
from tests.support.collectors import snapshot_of, wait_for, window_count


def connect(collector: Collector) -> socket.socket:
    assert collector.address.port is not None
    return socket.create_connection(("127.0.0.1", collector.address.port), timeout=5)


def hello(run: str = "job", rank: int = 0) -> bytes:
    return encode(Hello(run_id=run, rank=rank, world_size=2, pid=1000 + rank))


def window(run: str = "job", rank: int = 0, seq: int = 1) -> bytes:
    return encode(Window(run_id=run, rank=rank, seq=seq, t0=seq * 0.5, t1=seq * 0.5 + 0.5, steps=5, step_total=5 * seq))


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the collector hung up (after its TCP greeting, which is read past)."""
    sock.settimeout(5)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_many_runs_and_ranks_are_kept_apart(collector: Collector) -> None:
    socks = []
    for run in ("a", "b"):
        for rank in range(3):
            s = connect(collector)
            s.sendall(hello(run, rank) + window(run, rank, 1) + window(run, rank, 2))
            socks.append(s)
    assert wait_for(lambda: sum(len(r.windows) for r in snapshot_of(collector).all_ranks()) == 12)
    snap = snapshot_of(collector)
    assert [(r.run_id, [v.rank for v in r.ranks]) for r in snap.runs] == [("a", [0, 1, 2]), ("b", [0, 1, 2])]
    assert all(v.status == LIVE for v in snap.all_ranks())
    for s in socks:
        s.close()


@pytest.mark.parametrize(
    ("garbage", "reason"),
    [
        (b"this is not json\n", "not JSON"),
        (b'{"v":2,"type":"window","run_id":"job","rank":0}\n', "protocol version"),
        (b"x" * (MAX_FRAME_BYTES + 10) + b"\n", "frame over"),
    ],
)
def test_a_bad_frame_closes_only_its_connection(collector: Collector, garbage: bytes, reason: str) -> None:
    good = connect(collector)
    good.sendall(hello("good", 0) + window("good", 0, 1))
    bad = connect(collector)
    bad.sendall(hello("bad", 0))
    bad.sendall(garbage)
    assert closed_by_peer(bad)
    good.sendall(window("good", 0, 2))
    assert wait_for(lambda: any(len(v.windows) == 2 for v in snapshot_of(collector).all_ranks()))
    snap = snapshot_of(collector)
    statuses = {v.run_id: v for v in snap.all_ranks()}
    assert statuses["good"].status == LIVE
    assert statuses["bad"].status == LOST and reason in statuses["bad"].status_reason
    assert any(reason in r for r in snap.rejected)
    good.close()


def test_a_window_before_hello_is_refused(collector: Collector) -> None:
    s = connect(collector)
    s.sendall(window())
    assert closed_by_peer(s)
    assert snapshot_of(collector).runs == ()


def test_closed_connection_marks_lost_and_bye_marks_done(collector: Collector) -> None:
    a, b = connect(collector), connect(collector)
    a.sendall(hello("job", 0) + window("job", 0))
    b.sendall(hello("job", 1) + window("job", 1) + encode(Bye(run_id="job", rank=1, t=1.0, step_total=5)))
    assert wait_for(lambda: len(snapshot_of(collector).all_ranks()) == 2)
    a.close()
    b.close()
    assert wait_for(lambda: [v.status for v in snapshot_of(collector).all_ranks()] == [LOST, DONE])


def test_a_silent_rank_is_lost_after_the_timeout() -> None:
    store = Store(lost_after_s=5.0)
    store.ingest(Hello(run_id="r", rank=0), now=100.0)
    assert store.snapshot(104.0).all_ranks()[0].status == LIVE
    (view,) = store.snapshot(106.0).all_ranks()
    assert view.status == LOST and "silent" in view.status_reason


def test_resent_backlog_windows_are_not_counted_twice() -> None:
    store = Store()
    store.ingest(Hello(run_id="r", rank=0), now=1.0)
    for seq in (1, 2, 3, 2, 3, 4):  # a reconnect re-sends 2 and 3
        store.ingest(Window(run_id="r", rank=0, seq=seq, t0=seq, t1=seq + 0.5, steps=1, step_total=seq), now=1.0)
    assert [w.seq for w in store.snapshot(1.0).all_ranks()[0].windows] == [1, 2, 3, 4]


def test_second_dashboard_on_the_same_socket_gets_a_one_line_error(tmp_path) -> None:
    path = tmp_path / "g.sock"
    first = Collector(Store(), Address(path=path))
    first.start()
    try:
        with pytest.raises(AddressError, match="already listening"):
            Collector(Store(), Address(path=path)).start()
    finally:
        first.stop()
    assert not path.exists()


def test_stale_socket_file_from_a_killed_dashboard_is_replaced(tmp_path) -> None:
    path = tmp_path / "g.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens
    c = Collector(Store(), Address(path=path))
    c.start()
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(path))
        s.sendall(hello())
        assert wait_for(lambda: len(snapshot_of(c).all_ranks()) == 1)
        s.close()
    finally:
        c.stop()


def test_tcp_port_in_use_is_a_one_line_error(collector: Collector) -> None:
    with pytest.raises(AddressError, match="cannot listen"):
        Collector(Store(), Address(port=collector.address.port)).start()


def test_collector_survives_a_connection_reset_mid_frame(collector: Collector) -> None:
    s = connect(collector)
    s.sendall(hello() + b'{"v":1,"type":"win')
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    s.close()
    time.sleep(0.2)
    other = connect(collector)
    other.sendall(hello("other", 0))
    assert wait_for(lambda: any(v.run_id == "other" for v in snapshot_of(collector).all_ranks()))
    other.close()


def test_a_new_process_under_the_same_name_starts_a_fresh_history() -> None:
    """A restarted rank (or a later job on the same port) counts its windows from 1 again."""
    store = Store()
    store.ingest(Hello(run_id="r", rank=0, pid=100), now=1.0)
    for seq in (1, 2, 3):
        store.ingest(Window(run_id="r", rank=0, seq=seq, t0=seq, t1=seq + 0.5, steps=1, step_total=seq), now=1.0)
    store.disconnected("r", 0, "connection closed")
    store.ingest(Hello(run_id="r", rank=0, pid=200), now=2.0)
    store.ingest(Window(run_id="r", rank=0, seq=1, t0=9, t1=9.5, steps=1, step_total=1), now=2.0)
    (view,) = store.snapshot(2.0).all_ranks()
    assert view.hello.pid == 200 and [w.seq for w in view.windows] == [1] and view.status == LIVE


def test_the_old_connection_closing_late_does_not_mark_its_successor_lost() -> None:
    store = Store()
    store.ingest(Hello(run_id="r", rank=0, pid=100), now=1.0)
    store.ingest(Hello(run_id="r", rank=0, pid=200), now=2.0)  # restarted before the old EOF was seen
    store.disconnected("r", 0, "connection closed", pid=100)
    assert store.snapshot(2.0).all_ranks()[0].status == LIVE
    store.disconnected("r", 0, "connection closed", pid=200)
    assert store.snapshot(2.0).all_ranks()[0].status == LOST


def test_one_connection_cannot_claim_many_ranks(collector: Collector) -> None:
    s = connect(collector)
    s.sendall(b"".join(hello("flood", rank) for rank in range(50)))
    assert closed_by_peer(s)
    assert len(snapshot_of(collector).all_ranks()) <= 8
    assert any("ranks on one connection" in r for r in snapshot_of(collector).rejected)


def test_a_long_lived_dashboard_forgets_the_oldest_finished_runs() -> None:
    from gputop.collect.store import MAX_RUNS

    store = Store()
    for n in range(MAX_RUNS + 10):
        store.ingest(Hello(run_id=f"run{n}", rank=0, pid=n + 1), now=float(n))
        store.ingest(Bye(run_id=f"run{n}", rank=0, t=float(n)), now=float(n))
    store.ingest(Hello(run_id="live", rank=0, pid=9999), now=100.0)
    runs = [r.run_id for r in store.snapshot(100.0).runs]
    assert len(runs) <= MAX_RUNS and "live" in runs and "run0" not in runs and f"run{MAX_RUNS + 9}" in runs


def test_a_backlog_larger_than_a_read_arrives_whole() -> None:
    """A late dashboard gets minutes of windows at once: more than one read's worth, cut anywhere."""
    c = Collector(Store(history_windows=None), Address(port=0))
    c.start()
    try:
        backlog = hello() + b"".join(window(seq=seq) for seq in range(1, 3001))
        assert len(backlog) > READ_BUFFER_BYTES
        s = connect(c)
        s.sendall(backlog)
        assert wait_for(lambda: window_count(c) == 3000)
        assert [w.seq for w in snapshot_of(c).all_ranks()[0].windows] == list(range(1, 3001))
        s.close()
    finally:
        c.stop()


def test_stopping_the_collector_closes_every_connection_and_says_why(tmp_path) -> None:
    gone: list[tuple[str, int, str]] = []
    c = Collector(Store(), Address(port=0), on_disconnect=lambda run, rank, why, t, pid: gone.append((run, rank, why)))
    c.start()
    s = connect(c)
    s.sendall(hello("job", 3))
    assert wait_for(lambda: len(snapshot_of(c).all_ranks()) == 1)
    c.stop()
    assert gone == [("job", 3, "dashboard stopped")]
    (view,) = snapshot_of(c).all_ranks()
    assert view.status == LOST and view.status_reason == "dashboard stopped"
    assert closed_by_peer(s)
    s.close()


def notice_of(n: int) -> tuple[FindingBrief, ...]:
    """Findings that differ for each ``n``: ~6 KiB a notice."""
    return tuple(
        FindingBrief(cause="straggler", severity="warn", title=f"notice {n} finding {i} " + "x" * 250, ranks=(0,))
        for i in range(20)
    )


def test_a_rank_that_stops_reading_costs_a_bounded_buffer_and_hears_the_latest_findings(collector: Collector) -> None:
    """Findings notices to a rank that does not read are dropped past a bound, not buffered for ever.

    When it reads again it is told the run's findings as they are then; a capture asked of it
    meanwhile is refused at once instead of waiting for a rank that will not read it.
    """
    rank = socket.socket()
    rank.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    rank.connect(("127.0.0.1", collector.address.port or 0))
    rank.sendall(hello("r", 0))
    assert wait_for(lambda: len(snapshot_of(collector).all_ranks()) == 1)
    notices = 2000
    for n in range(notices):
        collector.notify_findings("r", notice_of(n))
    # The loop takes calls in order: once this request is answered, every notice has been handled.
    answer = collector.request_capture(CaptureRequest(rank=0, id="while-not-reading", timeout_s=5)).result(30)
    assert not answer.ok and "stopped reading" in answer.error
    received = read_until_quiet(rank)
    frame_bytes = len(encode(FindingsNotice(run_id="r", rank=0, t=0.0, findings=notice_of(0))))
    kernel_bytes = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])  # the collector's send buffer
    kernel_bytes += rank.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    assert notices * frame_bytes > 2 * kernel_bytes  # enough was sent to overflow what the kernel holds
    assert len(received) <= kernel_bytes + MAX_QUEUED_DOWN_BYTES + 2 * frame_bytes
    *_, last, tail = received.split(b"\n")
    assert tail == b""
    told = decode_command(last)
    assert isinstance(told, FindingsNotice) and told.findings == notice_of(notices - 1)
    assert window_count(collector) == 0 and snapshot_of(collector).all_ranks()[0].status == LIVE
    rank.close()


def read_until_quiet(sock: socket.socket, quiet_s: float = 1.0) -> bytes:
    """Everything the peer sends until it has sent nothing for ``quiet_s``."""
    sock.settimeout(quiet_s)
    data = bytearray()
    with contextlib.suppress(TimeoutError):
        while chunk := sock.recv(65536):
            data += chunk
    return bytes(data)


def test_a_capture_client_gets_its_answer_from_the_rank_it_named(collector: Collector) -> None:
    rank = connect(collector)
    rank.sendall(hello("job", 0))
    assert wait_for(lambda: len(snapshot_of(collector).all_ranks()) == 1)
    request = CaptureRequest(rank=0, id="cap-1", steps=3, timeout_s=10)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked = pool.submit(ask, collector.address, request)
        rank.settimeout(10)
        down = b""
        while down.count(b"\n") < 2:  # the collector's TCP greeting, then the request
            down += rank.recv(4096)
        command = decode_command(down.split(b"\n")[1])
        assert isinstance(command, CaptureRequest) and command.id == "cap-1" and command.run_id == "job"
        rank.sendall(encode(CaptureResult(run_id="job", rank=0, id="cap-1", t=1.0, ok=True, steps=3)))
        answer = asked.result(20)
    assert answer.ok and answer.steps == 3
    nobody = ask(collector.address, CaptureRequest(rank=5, id="cap-2", timeout_s=5))
    assert not nobody.ok and "no rank 5 is reporting" in nobody.error
    rank.close()
