"""`make gpu-check` without a GPU: one line saying why and exit 2, from the real script (it imports torch)."""

from __future__ import annotations

import importlib.util
import json
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


def test_a_budget_skips_the_checks_that_no_longer_fit_and_the_json_says_what_each_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []

    def quick() -> list[object]:
        ran.append("quick")
        return [gpu_check.Row("quick", "x", "x", "pass")]

    def long() -> list[object]:
        ran.append("long")
        return [gpu_check.Row("long", "x", "x", "pass")]

    monkeypatch.setattr(gpu_check, "why_no_gpu", lambda: None)
    monkeypatch.setattr(gpu_check, "machine_line", lambda: "a test machine")
    monkeypatch.setattr(gpu_check, "CHECKS", {"quick": gpu_check.Check(quick, 1), "long": gpu_check.Check(long, 600)})
    status = gpu_check.main(
        ["--budget-s", "60", "--output", str(tmp_path / "t.md"), "--json", str(tmp_path / "t.json")]
    )

    assert ran == ["quick"]
    assert status == 1  # a skipped row is not a pass: the run is incomplete
    record = json.loads((tmp_path / "t.json").read_text())
    assert record["checks"]["quick"]["seconds"] is not None and record["checks"]["long"]["seconds"] is None
    assert [row["result"].split(":")[0] for row in record["rows"]] == ["pass", "skipped"]
    assert "skipped: ~600 s needed" in (tmp_path / "t.md").read_text()
