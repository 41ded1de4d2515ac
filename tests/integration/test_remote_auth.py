"""TLS between a reporter and a collector, with a certificate the real openssl makes."""

from __future__ import annotations

import subprocess

import pytest

from gputop import auth
from gputop.address import Address
from gputop.collect.server import Collector
from gputop.collect.store import Store
from gputop.protocol import Hello, Window, encode
from gputop.reporter.sender import Sender
from tests.support.collectors import TOKEN, wait_for, window_count


def _self_signed(tmp_path: object) -> tuple[str, str]:
    cert, key = f"{tmp_path}/cert.pem", f"{tmp_path}/key.pem"
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        capture_output=True, text=True,
    )  # fmt: skip
    if made.returncode != 0:
        pytest.fail(f"openssl could not make a test certificate: {made.stderr.strip()}")
    return cert, key


def test_over_tls_with_the_token(tmp_path: object) -> None:
    cert, key = _self_signed(tmp_path)
    tls = Collector(Store(), Address(port=0), security=auth.Security(token=TOKEN, tls_cert=cert, tls_key=key))
    tls.start()
    sender = Sender(tls.address, backlog_frames=10, security=auth.Security(token=TOKEN, tls_ca=cert))
    sender.set_hello(encode(Hello(run_id="r", rank=0)))
    sender.enqueue(encode(Window(run_id="r", rank=0, seq=1, t0=0, t1=0.5, steps=1, step_total=1)))
    try:
        assert wait_for(lambda: (sender.pump(), window_count(tls) == 1)[1], timeout_s=10)
        plain = Sender(tls.address, backlog_frames=10, security=auth.Security(token=TOKEN))
        plain.pump()  # no TLS on our side: the collector's greeting is TLS, not a challenge
        assert not plain.connected
    finally:
        sender.close()
        tls.stop()
