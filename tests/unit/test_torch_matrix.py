"""docs/torch.md's table is what benchmarks/torch_matrix.py makes of the releases' JSON files, never typed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("torch_matrix", ROOT / "benchmarks" / "torch_matrix.py")
assert _spec is not None and _spec.loader is not None
matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(matrix)


def test_the_docs_table_is_made_from_every_releases_results() -> None:
    results = matrix.load_results()
    assert results, f"no results in {matrix.RESULTS}"
    doc = matrix.DOC.read_text()
    assert doc == matrix.made_doc(doc, results), "docs/torch.md differs: python benchmarks/torch_matrix.py --table"


def test_a_stack_that_read_nothing_or_failed_says_so_in_bold() -> None:
    failed = {"error": "RuntimeError: fsdp2_job.py exited 1"}
    unread = {"steps": 20, "phases": "hooks", "forward_ms": 3.0, "collectives": [], "mfu_pct": None}
    compiled = {"steps": 30, "recompiles": 9, "gputop_frames_compiled": ["_on_forward"]}
    assert matrix.cell(failed).startswith("**failed**")
    assert matrix.cell(unread).startswith("**no collective read**")
    assert "**gputop's _on_forward**" in matrix.cell(compiled)
