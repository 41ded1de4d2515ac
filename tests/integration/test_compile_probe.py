"""The torch.compile probe against a real dynamo: compiles, recompiles, their time and reason, as they happen."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.support.processes import needs_torch

pytestmark = needs_torch


def test_a_function_fed_three_shapes_under_dynamic_false_recompiles_twice() -> None:
    pytest.importorskip("torch")
    import torch

    from gputop.reporter.probes.compile import CompileProbe

    probe = CompileProbe()
    probe.read([])  # whatever earlier tests compiled in this process is not this window's

    @torch.compile(backend="eager", dynamic=False)
    def scaled_sum(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sum()

    fields = []
    for n in (3, 3, 5, 7, 7):
        scaled_sum(torch.ones(n))
        fields.append(probe.read([]))
    assert [(f["compiles"], f["recompiles"]) for f in fields] == [(1, 0), (0, 0), (1, 1), (1, 1), (0, 0)], fields
    assert all(f["compile_s"] > 0 for f in fields if f["compiles"]) and fields[1]["compile_s"] == 0.0, fields
    assert fields[-1]["graph_breaks"] >= 0
    notes = probe.take_notes()
    assert [kind for kind, _ in notes] == ["compile", "recompile", "recompile"], notes
    assert notes[1][1].startswith("recompiled 'scaled_sum' (test_compile_probe.py:"), notes
    assert "size mismatch at index 0. expected 3, actual 5" in notes[1][1], notes
    assert probe.take_notes() == []  # each note is taken once


def test_the_probe_never_imports_dynamo() -> None:
    code = """
        import sys
        import torch
        from gputop.reporter.probes.compile import CompileProbe
        assert CompileProbe().read([]) == {}
        print("torch._dynamo" in sys.modules)
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stdout + out.stderr
