"""Remote reporting: the token handshake, refusals counted, listeners that refuse to start open."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from gputop import auth
from gputop.address import Address, AddressError, parse_host_port, resolve
from gputop.collect.server import Collector
from gputop.collect.store import Store
from gputop.protocol import Hello, Window, encode
from gputop.reporter.sender import Sender
from tests.support.collectors import TOKEN, snapshot_of, wait_for, window_count


def sender_to(collector: Collector, token: str) -> Sender:
    sender = Sender(collector.address, backlog_frames=100, security=auth.Security(token=token))
    sender.set_hello(encode(Hello(run_id="r", rank=0)))
    sender.enqueue(encode(Window(run_id="r", rank=0, seq=1, t0=0, t1=0.5, steps=1, step_total=1)))
    return sender


def test_the_mac_depends_on_token_role_and_both_nonces() -> None:
    base = auth.mac(TOKEN, "reporter", "aa", "bb")
    assert auth.verify(TOKEN, "reporter", "aa", "bb", base)
    assert not auth.verify("other", "reporter", "aa", "bb", base)
    assert not auth.verify(TOKEN, "collector", "aa", "bb", base)  # a proof is not reusable the other way
    assert not auth.verify(TOKEN, "reporter", "ab", "bb", base)
    assert not auth.verify(TOKEN, "reporter", "aa", "bc", base)
    assert TOKEN not in auth.encode_frame(auth.answer(auth.Challenge(nonce="aa", token=True), TOKEN)).decode()


def test_the_right_token_is_admitted(guarded: Collector) -> None:
    sender = sender_to(guarded, TOKEN)
    try:
        assert wait_for(lambda: (sender.pump(), window_count(guarded) == 1)[1], timeout_s=10)
        assert sender.refused == "" and guarded.store.token_refusals == 0
    finally:
        sender.close()


@pytest.mark.parametrize(("token", "why"), [("wrong", "wrong token"), ("", "requires a token")])
def test_a_wrong_or_missing_token_is_refused_counted_and_said_in_one_line(
    guarded: Collector, token: str, why: str
) -> None:
    sender = sender_to(guarded, token)
    sender.pump()
    assert not sender.connected
    assert why in sender.refused and "\n" not in sender.refused
    assert TOKEN not in sender.refused
    assert window_count(guarded) == 0
    # A reporter without a token hangs up at the challenge: that counts as a missing token.
    assert wait_for(lambda: guarded.store.token_refusals == 1, timeout_s=5)
    expected = "wrong token" if token else "missing token"
    assert any(expected in r for r in snapshot_of(guarded).rejected)
    sender.pump(time.monotonic() + 1)  # refused: it waits well past the usual backoff before trying again
    assert guarded.store.token_refusals <= 1


def test_a_reporter_that_skips_the_handshake_is_refused(guarded: Collector) -> None:
    with socket.create_connection(("127.0.0.1", guarded.address.port or 0), timeout=5) as raw:
        raw.sendall(encode(Hello(run_id="r", rank=0)))
        answer = raw.makefile("rb").read()  # the challenge, the refusal, then the close
    assert b'"refused"' in answer and b"missing token" in answer
    assert wait_for(lambda: guarded.store.token_refusals == 1)
    assert window_count(guarded) == 0


def test_a_reporter_with_a_token_will_not_feed_a_collector_that_cannot_prove_it(collector: Collector) -> None:
    sender = sender_to(collector, TOKEN)  # `collector`: no token
    sender.pump()
    assert not sender.connected and "GPUTOP_TOKEN is set" in sender.refused


def test_gputop_addr_and_listen_parse_host_and_port() -> None:
    assert resolve(env={"GPUTOP_ADDR": "node-0:32001"}) == Address(host="node-0", port=32001)
    assert resolve(listen=":32001") == Address(host="0.0.0.0", port=32001)
    assert parse_host_port("[::1]:32001", "x") == Address(host="::1", port=32001)
    with pytest.raises(AddressError, match="GPUTOP_ADDR='node-0' is not HOST:PORT"):
        resolve(env={"GPUTOP_ADDR": "node-0"})


def test_a_network_listener_without_a_token_refuses_to_start(tmp_path: object) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPUTOP_TOKEN"}
    for command in ("record", "attach"):
        extra = ["--seconds", "1", "-o", f"{tmp_path}/x.jsonl"] if command == "record" else []
        done = subprocess.run(
            [sys.executable, "-m", "gputop", command, "--listen", "0.0.0.0:32001", *extra],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and "GPUTOP_TOKEN" in done.stderr
    with pytest.raises(AddressError, match="without GPUTOP_TOKEN"):
        Collector(Store(), Address(host="0.0.0.0", port=32001), security=auth.Security()).start()
