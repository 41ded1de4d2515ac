"""A real Prometheus server for tests: Debian's `prometheus` binary scraping gputop every second."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

SCRAPE_INTERVAL_S = 1


class Prometheus:
    """Runs ``prometheus`` with one scrape job over ``targets``; ``query()`` asks its HTTP API."""

    def __init__(
        self, targets: list[str], folder: Path, port: int, *, netns: str | None = None, rules: Path | None = None
    ) -> None:
        """``rules``: a rule file Prometheus loads and evaluates at the scrape interval."""
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("the `prometheus` binary is missing: apt-get install prometheus (.ci/run installs it)")
        config = folder / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {SCRAPE_INTERVAL_S}s\n  scrape_timeout: {SCRAPE_INTERVAL_S}s\n"
            f"  evaluation_interval: {SCRAPE_INTERVAL_S}s\n"
            + (f"rule_files:\n  - {json.dumps(str(rules))}\n" if rules is not None else "")
            + f"scrape_configs:\n  - job_name: gputop\n    static_configs:\n      - targets: {json.dumps(targets)}\n"
        )
        self.url = f"http://127.0.0.1:{port}"
        cmd = [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
               f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]  # fmt: skip
        if netns is not None:
            cmd = ["ip", "netns", "exec", netns, *cmd]
        self.log = folder / "prometheus.log"
        self._log = open(self.log, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        self.netns = netns

    def get(self, path: str) -> Any:
        url = self.url + path
        if self.netns is None:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.load(response)
        # Prometheus listens inside the namespace: ask from there.
        fetch = (
            f"import sys, urllib.request; sys.stdout.buffer.write(urllib.request.urlopen({url!r}, timeout=5).read())"
        )
        done = subprocess.run(
            ["ip", "netns", "exec", self.netns, sys.executable, "-c", fetch], capture_output=True, timeout=15
        )
        if done.returncode != 0:
            raise OSError(f"GET {url} in {self.netns} failed: {done.stderr.decode(errors='replace')[-300:]}")
        return json.loads(done.stdout)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                if self.get("/api/v1/status/runtimeinfo").get("status") == "success":
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.5)
        pytest.fail(f"prometheus did not come up in {timeout_s:.0f} s: {self.log.read_text()[-2000:]}")

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector a PromQL query returns: [{"metric": {...}, "value": [t, "v"]}, ...]."""
        answer = self.get("/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
