"""The house keeps its rules readable: each rule function reads top to bottom on one screen."""

from __future__ import annotations

import ast
from pathlib import Path

import gputop.diagnose.rules

RULES = Path(gputop.diagnose.rules.__file__).parent
# A rule measures, decides, grades and words; past this many lines one of those wants a function of its own.
MAX_RULE_FUNCTION_LINES = 60


def test_no_function_in_the_rules_is_longer_than_a_screen() -> None:
    long = []
    for path in sorted(RULES.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_RULE_FUNCTION_LINES:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert len(list(RULES.glob("*.py"))) > 10  # the rules are where this looks
    assert not long, long
