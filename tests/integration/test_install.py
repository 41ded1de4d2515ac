"""The package as a user gets it: built with `python -m build`, installed into fresh venvs, run.

One build (sdist, and the wheel built from it) is shared by the tests.  The wheel goes
into a venv without torch, where the dashboard side must import and run; the sdist goes
into another with the ``[torch]`` extra, where ``gputop demo`` runs a real 2-rank job.
pip fetches the dependencies as a user's would (its cache makes that quick), so
these tests need what ``make test`` needs already: the package index.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import gputop

# The builds write gputop_train.egg-info and build/ into the source tree: one worker at a time (with test_gpu_bundle).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("builds-in-the-tree")]

ROOT = Path(__file__).resolve().parents[2]
VERSION = gputop.__version__
# The CPU build this machine's pip finds locally (the Makefile's TORCH_SPEC): an unpinned
# torch>=2.1 from the [torch] extra would resolve to the newest release, gigabytes of CUDA wheels.
TORCH_SPEC = "torch==2.13.0"
OTHER_GPUTOP = "gputop==0.3.0"  # the unrelated PyPI project whose files collide with ours
DASHBOARD_MODULES = "gputop, gputop.cli, gputop.tui.app, gputop.collect.gpu.sampler, gputop.cli.install_check"


@dataclass(frozen=True)
class Dists:
    wheel: Path
    sdist: Path
    build_log: str


def user_env() -> dict[str, str]:
    """This environment without what would point a child at the source tree or at a collector.

    Without PYTHONDONTWRITEBYTECODE too: under it setuptools warns that it cannot byte-compile,
    which says nothing about the package and would hide the warnings that do.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUTOP_")}
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    return env


def run(*cmd: str | Path, cwd: Path, timeout_s: float = 180.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command away from the source tree (so ``import gputop`` cannot find it in the cwd)."""
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=user_env(), capture_output=True, text=True, timeout=timeout_s
    )
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def make_venv(path: Path) -> Path:
    """A fresh venv with pip, as a user makes one; its bin/ folder."""
    venv.EnvBuilder(with_pip=True).create(path)
    return path / "bin"


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    assert importlib.util.find_spec("build"), "the `build` package is missing: pip install -e . --group test"
    out = tmp_path_factory.mktemp("dist")
    proc = run(sys.executable, "-m", "build", "--outdir", out, ROOT, cwd=out)
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return Dists(wheel=wheel, sdist=sdist, build_log=proc.stdout + proc.stderr)


def test_the_build_is_clean_and_ships_what_a_user_needs(dists: Dists) -> None:
    warnings = [line for line in dists.build_log.splitlines() if re.search(r"warn|deprecat", line, re.IGNORECASE)]
    assert warnings == []
    assert dists.wheel.name == f"gputop_train-{VERSION}-py3-none-any.whl"
    assert dists.sdist.name == f"gputop_train-{VERSION}.tar.gz"

    with zipfile.ZipFile(dists.wheel) as whl:
        in_wheel = set(whl.namelist())
        entry_points = whl.read(f"gputop_train-{VERSION}.dist-info/entry_points.txt").decode()
    package_files = {  # every file under gputop/ but caches and editors' leftovers
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "gputop").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.startswith(".") and not p.name.endswith("~")
    }
    assert package_files - in_wheel == set()  # the stylesheet and the demos' scripts included
    assert "gputop/tui/gputop.tcss" in in_wheel
    assert not any(name.startswith("tests/") for name in in_wheel)
    assert "gputop = gputop.cli:main" in entry_points

    with tarfile.open(dists.sdist) as sdist:
        in_sdist = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    expected = package_files | {
        "README.md",
        "CHANGELOG.md",
        "pyproject.toml",
        "docs/grafana/gputop-dashboard.json",
        "docs/prometheus/prometheus.yml",
        "docs/prometheus/gputop-alerts.yml",
    }
    assert expected - in_sdist == set()


def test_the_wheel_without_torch_and_beside_the_other_gputop(dists: Dists, tmp_path: Path) -> None:
    """The dashboard side installs and runs without torch; the unrelated 'gputop' is named when it is there.

    The other project's wheel writes gputop/__init__.py (and a gputop/cli.py beside our gputop/cli/):
    installed after ours it takes them over; ours installed again takes them back, and
    then the check fires.  The fix it prints leaves ours whole.
    """
    bin_ = make_venv(tmp_path / "venv")
    python, gputop_cmd = bin_ / "python", bin_ / "gputop"
    run(bin_ / "pip", "install", "--quiet", dists.wheel, cwd=tmp_path)

    assert run(gputop_cmd, "--version", cwd=tmp_path).stdout.strip() == f"gputop {VERSION}"
    run(python, "-c", f"import {DASHBOARD_MODULES}", cwd=tmp_path)
    assert run(python, "-c", "import torch", cwd=tmp_path, check=False).returncode != 0
    check = "from gputop.cli.install_check import other_gputop; print(other_gputop())"
    assert run(python, "-c", check, cwd=tmp_path).stdout.strip() == "None"

    run(bin_ / "pip", "install", "--quiet", OTHER_GPUTOP, cwd=tmp_path)  # theirs after ours: ours broken
    assert run(python, "-c", "import gputop; print(gputop.__version__)", cwd=tmp_path).stdout.strip() == "0.3.0"

    run(bin_ / "pip", "install", "--quiet", "--force-reinstall", "--no-deps", dists.wheel, cwd=tmp_path)
    assert run(gputop_cmd, "--version", cwd=tmp_path).stdout.strip() == f"gputop {VERSION}"
    message = run(python, "-c", check, cwd=tmp_path).stdout.strip()
    assert message.startswith("the unrelated 'gputop' 0.3.0 from PyPI is installed here too")
    assert message.endswith("Fix: pip uninstall -y gputop gputop-train && pip install gputop-train")

    # The fix, with the wheel standing in for the index until gputop-train is published.
    run(bin_ / "pip", "uninstall", "--yes", "gputop", "gputop-train", cwd=tmp_path)
    run(bin_ / "pip", "install", "--quiet", dists.wheel, cwd=tmp_path)
    assert run(python, "-c", check, cwd=tmp_path).stdout.strip() == "None"
    run(python, "-c", f"import {DASHBOARD_MODULES}", cwd=tmp_path)


def test_the_sdist_with_torch_runs_the_demo(dists: Dists, tmp_path: Path) -> None:
    """From the sdist with the [torch] extra, `gputop demo` runs a real 2-rank DDP job, reports and records it."""
    bin_ = make_venv(tmp_path / "venv")
    requirement = f"gputop-train[torch] @ {dists.sdist.as_uri()}"
    # --no-compile: pip would byte-compile torch's ~2,300 modules ahead (~15 s); the demo compiles what it imports.
    run(bin_ / "pip", "install", "--quiet", "--no-compile", requirement, TORCH_SPEC, cwd=tmp_path, timeout_s=300)

    record = tmp_path / "demo.jsonl"
    demo = ("demo", "--headless", "--seconds", "4", "--format", "json", "--record", record)
    proc = run(bin_ / "gputop", *demo, cwd=tmp_path)
    cores = len(os.sched_getaffinity(0))
    assert f"demo 'healthy': 2 ranks x 1 compute thread on {cores} CPU" in proc.stderr, proc.stderr
    (demo_run,) = json.loads(proc.stdout)["runs"]
    assert demo_run["world_size"] == 2
    assert [r["rank"] for r in demo_run["ranks"]] == [0, 1]
    assert all(r["steps"] > 0 and r["status"] == "done" for r in demo_run["ranks"])
    # The recording of the same run reports the same steps.
    replayed = json.loads(run(bin_ / "gputop", "report", record, "--format", "json", cwd=tmp_path).stdout)
    assert [r["steps"] for r in replayed["runs"][0]["ranks"]] == [r["steps"] for r in demo_run["ranks"]]
