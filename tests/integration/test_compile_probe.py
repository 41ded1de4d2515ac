"""The torch.compile probe against a real dynamo: compiles, recompiles, their time and reason, as they happen; and
gputop's own hooks, which a compiled model must never trace."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from gputop.diagnose import diagnose
from gputop.model.figures import summarize
from gputop.model.snapshot import DONE
from tests.support.collectors import snapshot_of, wait_for
from tests.support.processes import finish, launch, needs_torch, run_script

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
    if recorded_reasons(torch):
        assert "size mismatch at index 0. expected 3, actual 5" in notes[1][1], notes
    else:  # torch before 2.7 keeps no recompile reason in its metrics: the note says so
        assert notes[1][1].endswith("no reason recorded"), notes
    assert probe.take_notes() == []  # each note is taken once


def recorded_reasons(torch: Any) -> bool:
    """Whether this torch's dynamo keeps each recompile's reason in its compilation metrics."""
    import dataclasses

    metrics = torch._dynamo.utils.CompilationMetrics
    return "recompile_reason" in {f.name for f in dataclasses.fields(metrics)}


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


def test_a_ddp_job_compiled_after_it_is_watched_compiles_nothing_of_gputop_and_reads_no_recompile(collector) -> None:
    """The README's two lines, then ``torch.compile(model)``: dynamo must never trace a hook of gputop's (traced, its
    reads of gputop's state were guards that failed every step: 23 recompiles a rank in 30 steps, and a recompile
    finding blaming the job), and the hooks must still see every forward, from the compiled model's wrapper."""
    out = finish(
        launch("compile_job.py", "--compile", "after", "--shapes", "1", "--steps", "30", port=collector.address.port),
        timeout_s=240,
    )
    # Read wherever it is: the two ranks write to one pipe, and their lines can run into each other.
    ranks = sorted(re.findall(r"rank (\d) (steps \d+ forwards \d+ recompiles \d+ gputop \[[^\]]*\])", out))
    assert [said for _, said in ranks] == ["steps 30 forwards 30 recompiles 0 gputop []"] * 2, out[-3000:]
    assert wait_for(lambda: all(v.status == DONE for v in snapshot_of(collector).all_ranks()), timeout_s=30)
    figures = summarize(snapshot_of(collector), span_s=None)
    compiled = [(r.rank, r.stats.compile.compiles, r.stats.compile.recompiles) for r in figures.all_ranks()]
    findings = [f"{f.cause}: {f.title}" for f in diagnose(figures)]
    assert all(recompiles == 0 for _, _, recompiles in compiled), (compiled, findings)
    assert not any(line.startswith("recompile") for line in findings), (compiled, findings)


def test_gputops_hooks_fold_away_under_fullgraph_in_place_compiles_and_compiled_autograd() -> None:
    """Each way a model is compiled, with ``fullgraph=True`` (where a graph break of gputop's would raise): no frame
    of gputop's compiled, no recompile, no graph break, and every training forward seen."""
    code = """
        import json, torch
        from torch import nn
        import gputop

        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

            def forward(self, x):
                return self.b(torch.relu(self.a(x)))

        results = {}
        for way in ("torch.compile(model)", "model.compile()", "compiled autograd", "compiled before watch"):
            torch._dynamo.reset()
            torch._dynamo.config.compiled_autograd = way == "compiled autograd"
            model = Model()
            if way == "compiled before watch":
                model = torch.compile(model, fullgraph=True, backend="eager")
            reporter = gputop.watch(model)
            if way == "model.compile()":
                model.compile(fullgraph=True, backend="eager")
            elif way != "compiled before watch":
                model = torch.compile(model, fullgraph=True, backend="eager")
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            before = reporter.side.train_forwards
            for _ in range(6):
                model(torch.randn(4, 16)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
            entries = torch._dynamo.utils._compilation_metrics
            results[way] = {
                "gputop frames": [e.co_name for e in entries if "gputop" in str(getattr(e, "co_filename", ""))],
                "recompiles": sum(1 for e in entries if getattr(e, "recompile_reason", None)),
                "graph breaks": sum(torch._dynamo.utils.counters["graph_break"].values()),
                "forwards seen": reporter.side.train_forwards - before,
            }
        print(json.dumps(results))
    """
    result = run_script(code, None, GPUTOP_PORT="1")  # nothing listens: the hooks run as they do with a collector
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads(result.stdout.strip().splitlines()[-1])
    clean = {"gputop frames": [], "recompiles": 0, "graph breaks": 0, "forwards seen": 6}
    assert results == {way: clean for way in results} and len(results) == 4, results
