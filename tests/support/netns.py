"""Hosts made of Linux network namespaces: a test's own little cluster on one machine.

``Cluster`` makes a namespace per host, joined by a bridge in the first one
(the "head", where a collector listens), with addresses 10.12.0.1, .2, ...
Each host gets its own host name too: a command runs under ``unshare --uts`` with
``hostname`` set, so ranks report the host they are on.  Needs root (or
CAP_SYS_ADMIN) and iproute2; where a namespace cannot be made the test fails
and says why, it never passes without having run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SUBNET = "10.12.0"


@dataclass(frozen=True)
class Host:
    netns: str
    hostname: str
    address: str

    def command(self, *argv: str) -> list[str]:
        """argv run inside this host's network namespace, under its own host name."""
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c",
                f'hostname {self.hostname} && exec "$@"', "sh", *argv]  # fmt: skip


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.stdout.strip()}")


class Cluster:
    """``hosts[0]`` is the head (bridge, 10.12.0.1); the others hang off it."""

    def __init__(self, names: list[str], prefix: str) -> None:
        self.prefix = prefix
        self.hosts = [Host(f"{prefix}-{name}", name, f"{SUBNET}.{i + 1}") for i, name in enumerate(names)]

    def create(self) -> None:
        for tool in ("ip", "unshare"):
            if shutil.which(tool) is None:
                pytest.fail(
                    f"cannot make network namespaces: `{tool}` is missing (apt-get install iproute2 util-linux)"
                )
        if os.geteuid() != 0:
            pytest.fail("cannot make network namespaces: this test needs root (ip netns add)")
        try:
            self._create()
        except OSError as exc:
            self.destroy()
            pytest.fail(f"cannot make network namespaces: {exc}")

    def _create(self) -> None:
        head = self.hosts[0]
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.hostname}\n" for h in self.hosts)
        for host in self.hosts:
            _run("ip", "netns", "add", host.netns)
            _run("ip", "-n", host.netns, "link", "set", "lo", "up")
            # `ip netns exec` mounts /etc/netns/NAME/hosts over /etc/hosts: every host resolves the others' names.
            etc = Path("/etc/netns") / host.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(hosts_file)
        _run("ip", "-n", head.netns, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", head.netns, "addr", "add", f"{head.address}/24", "dev", "br0")
        _run("ip", "-n", head.netns, "link", "set", "br0", "up")
        for i, host in enumerate(self.hosts[1:], start=1):
            port = f"p{i}"
            _run("ip", "link", "add", "eth0", "netns", host.netns, "type", "veth", "peer", "name", port,
                 "netns", head.netns)  # fmt: skip
            _run("ip", "-n", head.netns, "link", "set", port, "master", "br0", "up")
            _run("ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _run("ip", "-n", host.netns, "link", "set", "eth0", "up")

    def destroy(self) -> None:
        """Kill whatever still runs inside (our own processes only), then delete the namespaces."""
        for host in self.hosts:
            pids = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.2)
        for host in self.hosts:
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / host.netns, ignore_errors=True)
