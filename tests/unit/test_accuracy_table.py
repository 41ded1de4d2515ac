"""The accuracy figures in README.md and docs/diagnosis.md are the benchmark's JSON, not typed (issue #47).

benchmarks/accuracy_table.py makes each block between ``<!-- accuracy:begin KIND -->`` and
``<!-- accuracy:end -->`` from benchmarks/results/diagnosis-accuracy.json; a block edited by hand, or a JSON
committed without ``--write``, fails here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("accuracy_table", ROOT / "benchmarks" / "accuracy_table.py")
assert _spec is not None and _spec.loader is not None
table = importlib.util.module_from_spec(_spec)
sys.modules["accuracy_table"] = table
_spec.loader.exec_module(table)


def committed() -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(table.RESULTS.read_text(encoding="utf-8"))
    return payload


def test_the_docs_blocks_are_what_the_committed_json_makes() -> None:
    behind = [str(p.relative_to(ROOT)) for p in table.stale(table.DOCS, committed(), table.RESULTS)]
    assert behind == [], f"{behind}: run .venv/bin/python benchmarks/accuracy_table.py --write"


def test_each_doc_holds_its_blocks() -> None:
    kinds = {p.name: [m.group(2) for m in table.BLOCK.finditer(p.read_text(encoding="utf-8"))] for p in table.DOCS}
    assert kinds == {"README.md": ["summary"], "diagnosis.md": ["cases", "confusion"]}


def test_a_changed_figure_changes_the_block() -> None:
    payload = committed()
    text = "a\n<!-- accuracy:begin summary -->\ntyped by hand\n<!-- accuracy:end -->\nb\n"
    made = table.rewrite(text, payload, table.RESULTS)
    assert "typed by hand" not in made and made.startswith("a\n") and made.endswith("-->\nb\n")
    right = payload["summary"]["right"]
    assert f"**{right} of {payload['summary']['runs']}**" in made
    payload["summary"] = payload["summary"] | {"right": right - 1}
    assert table.rewrite(made, payload, table.RESULTS) != made
