"""`gputop doctor` as a user runs it: on this GPU-less machine, and against the NVML stand-in.

Each doctor run is a real `python -m gputop doctor` subprocess.  They are all
started together by one module fixture and read by the tests that need them,
because each spends about a second importing (torch most of it) and they
overlap well.  The checks called in this process (the socket folder, a collector
over TCP) are in tests/unit/test_doctor.py.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gputop import settings
from tests.support.nvml_standin import env_for, for_driver, h100_node

SECRET = "doctor-test-token-0451"  # must never appear in doctor's output
SCENARIO = h100_node(2)
DOCTOR_ENV = tuple(s.env for s in settings.SETTINGS if s.env)  # this shell's are not the test's


@dataclass
class DoctorRun:
    """One `gputop doctor` subprocess; ``wait()`` gives its exit status and output."""

    proc: subprocess.Popen[str]
    returncode: int = -1
    stdout: str = ""
    stderr: str = ""
    _done: bool = field(default=False, repr=False)

    def wait(self) -> DoctorRun:
        if not self._done:
            self.stdout, self.stderr = self.proc.communicate(timeout=60)
            self.returncode = self.proc.returncode
            self._done = True
        return self

    def line(self, name: str) -> str:
        """The check's line (its first, with the mark), as text output shows it."""
        for text in self.stdout.splitlines():
            if text[4:].split("  ")[0].strip() == name:
                return text
        raise AssertionError(f"no {name!r} line in:\n{self.stdout}")

    def block(self, name: str) -> str:
        """The check's line and the indented lines under it."""
        lines = self.stdout.splitlines()
        start = lines.index(self.line(name))
        end = start + 1
        while end < len(lines) and lines[end].startswith(" "):
            end += 1
        return "\n".join(lines[start:end])


# `gputop doctor` where `import torch` fails as on a dashboard-only machine (a None entry in
# sys.modules is how Python marks a module that cannot be imported); it also skips torch's second of import.
WITHOUT_TORCH = "import sys; sys.modules['torch'] = None; from gputop.cli import main; raise SystemExit(main())"


def start_doctor(env: Mapping[str, str], *args: str, torch: bool = True) -> DoctorRun:
    base = {k: v for k, v in os.environ.items() if k not in DOCTOR_ENV}
    interpreter = [sys.executable, "-m", "gputop"] if torch else [sys.executable, "-c", WITHOUT_TORCH]
    proc = subprocess.Popen(
        [*interpreter, "doctor", *args],
        env={**base, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return DoctorRun(proc)


@pytest.fixture(scope="module")
def listening(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A Unix socket something listens on, as a dashboard's would be."""
    path = tmp_path_factory.mktemp("listening") / "collector.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()
    yield path
    server.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, listening: Path) -> Iterator[dict[str, DoctorRun]]:
    folder = tmp_path_factory.mktemp("doctor")
    current = SCENARIO.write(folder / "current.txt")
    older = for_driver(SCENARIO, "no_v3").write(folder / "no_v3.txt")
    nobody = str(folder / "nobody.sock")
    config = folder / "config" / "gputop" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("gpu_hour_price = 2.5\n")
    mine = {"XDG_CONFIG_HOME": str(folder / "config")}
    started = {
        "no_gpu": start_doctor({**mine, "GPUTOP_TOKEN": SECRET, "GPUTOP_SOCKET": nobody, "GPUTOP_STACKS_HZ": "500"}),
        "standin": start_doctor({**env_for(current), "GPUTOP_SOCKET": str(listening)}),
        "standin_json": start_doctor(
            {**env_for(current), **mine, "GPUTOP_TOKEN": SECRET}, "--format", "json", torch=False
        ),
        "no_v3": start_doctor(env_for(older, "no_v3"), torch=False),
    }
    yield started
    for run in started.values():
        if run.proc.poll() is None:
            run.proc.kill()
        run.wait()


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has libnvidia-ml")
class TestWithoutAGpu:
    """This machine: no GPU and no libnvidia-ml, so exit 1 with the reason, and every other check still runs."""

    def test_exit_1_and_the_nvml_line_says_why(self, runs: dict[str, DoctorRun]) -> None:
        run = runs["no_gpu"].wait()
        assert run.returncode == 1, run.stderr
        assert run.stderr == ""
        assert run.line("nvml").startswith("!!")
        assert "libnvidia-ml not found" in run.line("nvml")

    def test_the_other_checks_still_run(self, runs: dict[str, DoctorRun]) -> None:
        run = runs["no_gpu"].wait()
        assert "torch" in run.line("torch")
        assert "gputop" in run.line("socket")  # the per-user socket's folder, wherever it is
        for name in ("driver calls", "gpus", "container", "collector", "token", "tls", "disable", "settings"):
            run.line(name)

    def test_a_socket_nobody_listens_on_is_named(self, runs: dict[str, DoctorRun]) -> None:
        line = runs["no_gpu"].wait().line("collector")
        assert line.startswith("!!")
        assert "nobody.sock" in line and "nothing listens" in line

    def test_the_token_is_reported_set_and_never_printed(self, runs: dict[str, DoctorRun]) -> None:
        run = runs["no_gpu"].wait()
        assert "GPUTOP_TOKEN set" in run.line("token")
        assert SECRET not in run.stdout + run.stderr

    def test_the_settings_in_force_with_their_sources(self, runs: dict[str, DoctorRun]) -> None:
        run = runs["no_gpu"].wait()
        block = run.block("settings")
        assert block.startswith("--  settings      GPUTOP_STACKS_HZ='500' is not 0.5-200 samples a second; 20 used")
        listed = {line.split()[0]: line.split(None, 2)[1:] for line in block.splitlines()[1:]}
        assert len(listed) == len(settings.SETTINGS)
        assert listed["GPUTOP_TOKEN"] == ["env", "set"]
        assert listed["GPUTOP_SOCKET"][0] == "env" and listed["GPUTOP_SOCKET"][1].endswith("nobody.sock")
        assert listed["gpu_hour_price"] == ["file", "2.5"]
        assert listed["GPUTOP_WINDOW_S"] == ["default", "1"]


class TestAgainstTheStandIn:
    """Two H100s behind the real bindings: exit 0, both GPUs, the driver and its versioned calls."""

    def test_exit_0_and_both_gpus_listed(self, runs: dict[str, DoctorRun]) -> None:
        run = runs["standin"].wait()
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.line("gpus").startswith("ok")
        gpus = run.block("gpus")
        for gpu in SCENARIO.gpus:
            assert gpu.name in gpus and gpu.uuid in gpus
        assert "81559 MiB" in gpus

    def test_driver_and_versioned_calls(self, runs: dict[str, DoctorRun]) -> None:
        run = runs["standin"].wait()
        assert "driver 550.54.15" in run.line("nvml")
        assert "CUDA 12.4" in run.line("nvml")
        assert run.line("driver calls").startswith("ok")
        assert "all 7" in run.line("driver calls")

    def test_a_listening_socket_is_found(self, runs: dict[str, DoctorRun], listening: Path) -> None:
        line = runs["standin"].wait().line("collector")
        assert line.startswith("ok")
        assert "listening" in line and str(listening) in line

    def test_json_has_the_same_facts(self, runs: dict[str, DoctorRun]) -> None:
        run = runs["standin_json"].wait()
        assert run.returncode == 0, run.stderr
        report = json.loads(run.stdout)
        assert report["gpus_visible"] is True
        checks = {c["name"]: c for c in report["checks"]}
        assert checks["nvml"]["facts"]["driver"] == "550.54.15"
        assert checks["nvml"]["facts"]["cuda"] == "12.4"
        assert all(checks["driver calls"]["facts"]["calls"].values())
        gpus = checks["gpus"]["facts"]["gpus"]
        assert [g["uuid"] for g in gpus] == [g.uuid for g in SCENARIO.gpus]
        assert [g["name"] for g in gpus] == [g.name for g in SCENARIO.gpus]
        assert checks["token"]["facts"] == {"set": True}
        in_force = {s["name"]: s for s in checks["settings"]["facts"]["settings"]}
        assert in_force["GPUTOP_TOKEN"] == {"name": "GPUTOP_TOKEN", "key": "token", "value": "set", "source": "env"}
        assert in_force["gpu_hour_price"]["value"] == 2.5 and in_force["gpu_hour_price"]["source"] == "file"
        assert SECRET not in run.stdout
        assert {c["mark"] for c in report["checks"]} <= {"ok", "--", "!!"}


class TestAnOlderDriver:
    """The no_v3 build (an R470-era library): the missing calls are named, with what gputop does instead."""

    def test_missing_calls_are_named_with_their_fallback(self, runs: dict[str, DoctorRun]) -> None:
        run = runs["no_v3"].wait()
        assert run.returncode == 0, run.stdout + run.stderr
        assert "driver 470.199.02" in run.line("nvml")
        calls = run.block("driver calls")
        assert calls.startswith("--")
        processes = next(line for line in calls.splitlines() if "RunningProcesses_v3" in line)
        assert "missing: processes listed through nvmlDeviceGetComputeRunningProcesses_v2" in processes
        memory = next(line for line in calls.splitlines() if "nvmlDeviceGetMemoryInfo_v2" in line)
        assert "missing" in memory
        assert "nvmlDeviceGetFieldValues" not in calls  # this driver has it


class TestWithoutTorch:
    """A dashboard-only machine: torch is absent, and that is said as a note, not a fault."""

    def test_the_torch_line_says_only_training_needs_it(self, runs: dict[str, DoctorRun]) -> None:
        torch = runs["no_v3"].wait().line("torch")
        assert torch.startswith("--")
        assert "torch not installed here (only training environments need it)" in torch
