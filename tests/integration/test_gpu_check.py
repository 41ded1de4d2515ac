"""`make gpu-check` without a GPU: one line saying why and exit 2, from the real script (it imports torch)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.gpu_check import SCRIPT, gpu_check


def _cuda_visible() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    probe = [sys.executable, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def test_without_a_gpu_it_says_why_in_one_line_and_exits_2(tmp_path: Path) -> None:
    if _cuda_visible():  # asked here, not at collection: the probe imports torch, seconds on a busy machine
        pytest.skip("this machine has a GPU: make gpu-check would run for real")
    result = subprocess.run([sys.executable, str(SCRIPT), "--output", str(tmp_path / "t.md")],
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == gpu_check.EXIT_NO_GPU == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpu-check: no GPU to check on: ")
    assert "torch" in lines[0] or "nvidia-smi" in lines[0] or "NVML" in lines[0]
    assert not (tmp_path / "t.md").exists()  # nothing measured, nothing written
