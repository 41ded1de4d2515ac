"""`gputop fleet`'s errors: each a line a user can act on, from real sockets and a real HTTP server."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from gputop.fleet.query import FleetError, Prometheus, read_fleet
from tests.support.processes import free_port


@pytest.fixture
def not_prometheus() -> Iterator[str]:
    """A web server that is not Prometheus: every path is 404."""

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_that_is_not_there_is_said_with_its_address() -> None:
    port = free_port()  # nothing listens there
    done = subprocess.run([sys.executable, "-m", "gputop", "fleet", f"127.0.0.1:{port}"], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1, done
    assert done.stderr == f"gputop: cannot reach Prometheus at http://127.0.0.1:{port}: Connection refused\n"


def test_a_web_server_that_is_not_prometheus_is_told_apart(not_prometheus: str) -> None:
    with pytest.raises(FleetError, match=r"answered HTTP 404 to a query: is it Prometheus\?"):
        read_fleet(Prometheus(not_prometheus))


@pytest.mark.parametrize("url", ["ftp://host:9090", "http://"])
def test_an_address_that_is_no_web_address_is_refused_before_any_connection(url: str) -> None:
    with pytest.raises(FleetError, match="is not a Prometheus address: give one as http://HOST:9090"):
        Prometheus(url)
