"""The collector: many reporters, bad frames close one connection, never the collector."""

from __future__ import annotations

import socket
import time

import pytest

from gputop.address import Address, AddressError
from gputop.collect.server import Collector
from gputop.collect.store import Store
from gputop.model.snapshot import DONE, LIVE, LOST
from gputop.protocol import MAX_FRAME_BYTES, Bye, Hello, Window, encode
from tests.conftest import snapshot_of, wait_for


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
