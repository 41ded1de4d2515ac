"""`gputop doctor`'s checks called in this process: the per-user socket folder, and a real collector over TCP."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from gputop.collect.server import Collector
from gputop.doctor.connect import check_collector, check_socket
from tests.support.collectors import TOKEN


class TestPerUserSocket:
    """The default socket's folder under XDG_RUNTIME_DIR: private, and whether a dashboard listens there."""

    def test_a_private_folder_with_a_listener(self, tmp_path: Path) -> None:
        folder = tmp_path / "gputop"
        folder.mkdir(mode=0o700)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(str(folder / "gputop.sock"))
            server.listen()
            check = check_socket({"XDG_RUNTIME_DIR": str(tmp_path)})
        assert check.status == "ok", check
        assert "listening" in check.summary
        assert check.facts["folder_mode"] == "0700" and check.facts["folder_uid"] == os.getuid()

    def test_a_private_folder_nobody_listens_in(self, tmp_path: Path) -> None:
        (tmp_path / "gputop").mkdir(mode=0o700)
        check = check_socket({"XDG_RUNTIME_DIR": str(tmp_path)})
        assert check.status == "note"
        assert "nothing listens" in check.summary and "start `gputop`" in check.fix

    def test_a_folder_others_can_read_is_a_problem(self, tmp_path: Path) -> None:
        folder = tmp_path / "gputop"
        folder.mkdir()
        folder.chmod(0o755)
        check = check_socket({"XDG_RUNTIME_DIR": str(tmp_path)})
        assert check.status == "problem"
        assert "chmod 700" in check.summary


class TestCollectorOverTcp:
    """GPUTOP_PORT tried with a reporter's own handshake against a real collector."""

    def test_a_collector_without_a_token_is_reachable(self, collector: Collector) -> None:
        check = check_collector({"GPUTOP_PORT": str(collector.address.port)})
        assert check.status == "ok", check
        assert f"127.0.0.1:{collector.address.port}" in check.summary
        assert collector.store.token_refusals == 0

    def test_the_right_token_is_admitted(self, guarded: Collector) -> None:
        check = check_collector({"GPUTOP_PORT": str(guarded.address.port), "GPUTOP_TOKEN": TOKEN})
        assert check.status == "ok", check
        assert guarded.store.token_refusals == 0

    def test_a_wrong_token_says_so(self, guarded: Collector) -> None:
        check = check_collector({"GPUTOP_PORT": str(guarded.address.port), "GPUTOP_TOKEN": "not it"})
        assert check.status == "problem"
        assert "wrong token" in check.summary
        assert "not it" not in check.summary + check.fix

    def test_nothing_listening_says_what_to_start(self, collector: Collector) -> None:
        port = collector.address.port
        collector.stop()
        check = check_collector({"GPUTOP_PORT": str(port)})
        assert check.status == "problem"
        assert f"gputop --port {port}" in check.fix
