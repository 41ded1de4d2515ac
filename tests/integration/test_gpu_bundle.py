"""The GPU check's dry run: `make gpu-bundle` here, then `scripts/gpu-device` as the lent machine runs it.

The lent machine has Python 3.12 and no registry; here a fresh 3.12 venv with nothing in it stands in
for it, so whatever gputop needs must come from the bundle alone.  Without a GPU the device script
installs, imports the reporter and the dashboard from the install, and stops with its one line.
Skipped with the reason where no Python 3.12 is found (the bundle is made for that version).
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest

# `pip wheel .` writes gputop_train.egg-info and build/ into the source tree: one worker at a time (test_install).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("builds-in-the-tree")]

ROOT = Path(__file__).resolve().parents[2]
DEVICE_PYTHON = "3.12"


def python_312() -> str | None:
    """A Python 3.12 that runs: on PATH or installed by pyenv (a pyenv shim can exist and refuse)."""
    pyenv = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    installed = glob.glob(f"{pyenv}/versions/{DEVICE_PYTHON}.*/bin/python{DEVICE_PYTHON}")
    candidates = [shutil.which(f"python{DEVICE_PYTHON}"), *sorted(installed, reverse=True)]
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                               capture_output=True, text=True)  # fmt: skip
        if probe.returncode == 0 and probe.stdout.strip() == DEVICE_PYTHON:
            return candidate
    return None


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what points at a collector or at this tree."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUTOP_") and k not in drop}
    return {**env, **extra}


def test_the_bundle_alone_installs_gputop_in_a_fresh_312_and_the_device_script_says_no_gpu(tmp_path: Path) -> None:
    python = python_312()
    if python is None:
        pytest.skip(f"no Python {DEVICE_PYTHON} here (pyenv install {DEVICE_PYTHON}): the bundle is made for it")
    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi: scripts/gpu-device would run the GPU check for real")

    bundle = tmp_path / "bundle"
    made = subprocess.run(["bash", "scripts/gpu-bundle", str(bundle)], cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    wheels = sorted(p.name for p in (bundle / "wheels").iterdir())
    assert any(w.startswith("gputop_train-") for w in wheels), wheels
    # What the device image lacks is in it, built for CPython 3.12; torch never is.
    assert any(w.startswith("textual-") for w in wheels)
    assert any(w.startswith("msgspec-") and "cp312" in w for w in wheels)
    assert not any(w.startswith(("torch-", "nvidia_nccl", "triton-")) for w in wheels), wheels
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    assert size < 32 << 20, f"{size / 2**20:.1f} MiB: the device call carries 64 MiB, the tree included"

    stand_in = tmp_path / "device-python"
    subprocess.run([python, "-m", "venv", str(stand_in)], check=True, timeout=120)
    out = tmp_path / "out"
    env = clean_env(OUT=str(out), GPU_PYTHON=str(stand_in / "bin" / "python"), PIP_NO_INDEX="1")
    result = subprocess.run(["bash", "scripts/gpu-device", str(bundle)], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)  # fmt: skip

    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpu-device: no GPU: "), lines[0]
    install_log = (out / "install.log").read_text()
    assert "Successfully installed" in install_log and "textual" in install_log and "msgspec" in install_log
    # The reporter and the dashboard imported from the install, not from this tree.
    imported_from = install_log.strip().splitlines()[-1]
    assert imported_from.endswith("gputop/__init__.py") and not imported_from.startswith(str(ROOT)), imported_from
    assert "installed from" in result.stdout
    assert len(list(out.iterdir())) <= 8  # what the device tool brings back
