"""The accuracy benchmark's figures in the docs, made from its JSON so that no one types them.

README.md and docs/diagnosis.md each hold blocks between marker comments:

    <!-- accuracy:begin KIND -->
    ...
    <!-- accuracy:end -->

where KIND is ``summary`` (one paragraph: how many runs were right, and the misses), ``confusion`` (the
confusion table with what ran, where and when) or ``cases`` (every case of the corpus with its latest verdict).
This script makes each block from the JSON that ``benchmarks/diagnosis_accuracy.py --out`` writes
(benchmarks/results/diagnosis-accuracy.json is the one the docs cite), with the benchmark's own table functions,
so the docs read what the benchmark printed.  A JSON made by ``--rescore DIR`` may carry a ``recorded`` key:
when and where the recordings it rescored were made (``started_utc``, ``machine``, ``command``, ``commit``), and
``rules_commit``, the commit whose rules rescored them.

    .venv/bin/python benchmarks/accuracy_table.py [JSON]            # print every block
    .venv/bin/python benchmarks/accuracy_table.py [JSON] --write    # rewrite the blocks in README.md and the docs
    .venv/bin/python benchmarks/accuracy_table.py [JSON] --check    # exit 1 where a doc's block differs

tests/unit/test_accuracy_table.py fails when a doc's block differs from what this makes of the committed JSON.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import fields
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "diagnosis-accuracy.json"
DOCS = (ROOT / "README.md", ROOT / "docs" / "diagnosis.md")
BLOCK = re.compile(r"(<!-- accuracy:begin (\w+) -->\n)(.*?)(<!-- accuracy:end -->)", re.DOTALL)


def benchmark() -> ModuleType:
    """benchmarks/diagnosis_accuracy.py, loaded by path (the benchmarks are scripts, not a package)."""
    if "diagnosis_accuracy" in sys.modules:
        return sys.modules["diagnosis_accuracy"]
    spec = importlib.util.spec_from_file_location("diagnosis_accuracy", ROOT / "benchmarks" / "diagnosis_accuracy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["diagnosis_accuracy"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def run_results(payload: dict[str, Any]) -> list[Any]:
    """The JSON's runs as the benchmark's ``RunResult``s (its lists back to the tuples the scoring compares)."""
    bench = benchmark()
    names = {f.name for f in fields(bench.RunResult)}
    runs = []
    for row in payload["results"]:
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in row.items() if k in names}
        runs.append(bench.RunResult(**values))
    return runs


def when(iso: str) -> str:
    return f"{datetime.datetime.fromisoformat(iso):%Y-%m-%d %H:%M} UTC"


# The arguments that name a folder or file of the machine that ran it, said by what they hold instead.
PATH_ARGUMENTS = {"--keep": "DIR", "--rescore": "DIR", "--out": "OUT.json"}


def command(argv: Iterable[str]) -> str:
    """The command as a reader reruns it: the run's own paths (``/tmp/s46/quiet``) as ``DIR`` and ``OUT.json``."""
    words = list(argv)
    for i, word in enumerate(words[:-1]):
        if word in PATH_ARGUMENTS:
            words[i + 1] = PATH_ARGUMENTS[word]
    return " ".join([".venv/bin/python", *words])


def provenance(payload: dict[str, Any]) -> str:
    """Where the figures come from: the run that recorded the jobs, and the rules that scored them."""
    recorded = payload.get("recorded")
    machine = payload["machine"]
    if recorded is None:
        return (
            f"Run {when(payload['started_utc'])} on {machine}, condition {payload['condition']}, "
            f"{payload['seconds']:g} s of training a run: `{command(payload['command'])}`."
        )
    return (
        f"Recorded {when(recorded['started_utc'])} at `{recorded['commit']}` on {recorded['machine']}, condition "
        f"{recorded['condition']}, {recorded['seconds']:g} s of training a run: `{command(recorded['command'])}`; "
        f"scored by the rules at `{payload['rules_commit']}` ({when(payload['started_utc'])}): "
        f"`{command(payload['command'])}`."
    )


def misses(runs: list[Any]) -> list[str]:
    """Each scored run that is not right: the case (and the run, where a case ran more than once) and what came
    first instead."""
    bench = benchmark()
    once = runs_per_case(runs) == 1
    return [
        f"`{r.case}` ({bench.scored(r)}{'' if once else f', run {r.run}'})" for r in runs if not r.void and not r.right
    ]


def runs_per_case(runs: list[Any]) -> int:
    return max((r.run for r in runs), default=0)


def summary_block(payload: dict[str, Any]) -> str:
    """One paragraph for the README: how many runs were right, how many void, and the misses."""
    runs = run_results(payload)
    total = payload["summary"]
    cases = len({r.case for r in runs})
    k = runs_per_case(runs)
    flips = (
        f"; flip rate {len(total['flipped_cases'])}/{total['cases']}" if k > 1 else f"; {k} run a case, so no flip rate"
    )
    wrong = misses(runs)
    text = (
        f"Its latest whole pass: **{total['right']} of {total['runs']}** scored runs right (the cause, and the ranks "
        f"it names) over its {cases} cases, {len(total['void'])} void; right cause on the wrong ranks "
        f"{len(total['ranks_wrong'])}{flips}."
    )
    if wrong:
        text += f" Not right (what came first instead): {', '.join(wrong)}."
    return f"{text}\n{provenance(payload)}\n"


def confusion_block(payload: dict[str, Any]) -> str:
    """The benchmark's confusion table and the lines under it, as it printed them, with what ran where."""
    bench = benchmark()
    runs = run_results(payload)
    text = f"{provenance(payload)}\n\n{bench.confusion_markdown(runs)}\n\n{bench.summary_text(payload['summary'])}\n"
    wrong = [r for r in runs if not r.void and not r.right]
    if wrong:
        text += "\nNot right, with the finding that came first:\n\n"
        text += "".join(
            f"- `{r.case}` run {r.run}: {r.top}: {r.top_title or '(no finding)'}{bench.verdict_mark(r)}\n"
            for r in wrong
        )
    return text


def cases_block(payload: dict[str, Any]) -> str:
    """Every case of the corpus, what it is, and its verdicts in the JSON's runs ("not run" where it has none)."""
    bench = benchmark()
    runs = run_results(payload)
    lines = ["| case | expected [ranks] | what it is | top finding [ranks named] |", "|---|---|---|---|"]
    for case in bench.CASES:
        verdicts = [verdict(r) for r in runs if r.case == case.name] or ["not run"]
        expected = case.expected if case.ranks is None else f"{case.expected} {bench.ranks_text(case.ranks)}"
        about = case.about.replace("|", "/")
        lines.append(f"| `{case.name}` | {expected} | {about} | {'; '.join(verdicts)} |")
    return "\n".join(lines) + "\n"


def verdict(result: Any) -> str:
    """A run's top finding and the ranks it names, then ✓, ✗ or void with why."""
    bench = benchmark()
    if result.void:
        return f"void ({result.void})"
    named = "" if result.top == bench.HEALTHY or result.allocation_first else f" {bench.ranks_text(result.named)}"
    if result.right:
        first = f"allocation first, {result.expected} listed" if result.allocation_first else f"{result.top}{named}"
        return f"{first} ✓"
    return f"{result.top}{named}{bench.verdict_mark(result)}".replace("|", "/")


KINDS: dict[str, Callable[[dict[str, Any]], str]] = {
    "summary": summary_block,
    "confusion": confusion_block,
    "cases": cases_block,
}


def generated_note(source: Path) -> str:
    try:
        shown = source.resolve().relative_to(ROOT)
    except ValueError:
        shown = source
    return f"<!-- made by benchmarks/accuracy_table.py --write from {shown}: edit that, not this -->\n"


def rewrite(text: str, payload: dict[str, Any], source: Path) -> str:
    """``text`` with every accuracy block made anew from ``payload``; an unknown kind is an error."""

    def block(match: re.Match[str]) -> str:
        kind = match.group(2)
        if kind not in KINDS:
            raise SystemExit(f"unknown accuracy block {kind!r}; the kinds are {', '.join(KINDS)}")
        return f"{match.group(1)}{generated_note(source)}{KINDS[kind](payload)}{match.group(4)}"

    return BLOCK.sub(block, text)


def stale(paths: Iterable[Path], payload: dict[str, Any], source: Path) -> list[Path]:
    """The docs whose blocks differ from what ``payload`` makes."""
    return [p for p in paths if rewrite(p.read_text(encoding="utf-8"), payload, source) != p.read_text("utf-8")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="?", type=Path, default=RESULTS, help=f"the benchmark's JSON (default {RESULTS})")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="rewrite the blocks in README.md and docs/diagnosis.md")
    action.add_argument("--check", action="store_true", help="exit 1 where a doc's block differs from the JSON's")
    args = parser.parse_args()
    payload = json.loads(args.json.read_text(encoding="utf-8"))
    if args.check:
        behind = stale(DOCS, payload, args.json)
        for path in behind:
            print(f"{path.relative_to(ROOT)}: its accuracy block differs; run benchmarks/accuracy_table.py --write")
        return 1 if behind else 0
    if args.write:
        for path in DOCS:
            path.write_text(rewrite(path.read_text(encoding="utf-8"), payload, args.json), encoding="utf-8")
        return 0
    for kind, make in KINDS.items():
        print(f"<!-- accuracy:begin {kind} -->\n{make(payload)}<!-- accuracy:end -->\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
