"""The house: each rule function reads top to bottom on one screen, and the map in docs/architecture.md is true."""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterator
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


BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def gputop_names_imported(path: Path) -> list[tuple[str, str, int]]:
    """Each ``from gputop.X import name`` in a file, anywhere in it (functions import lazily): module, name, line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (node.module, alias.name, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gputop"
        for alias in node.names
    ]


def module_level_names(statements: list[ast.stmt]) -> Iterator[str]:
    """The names a module's own statements bind, in its try/if/with blocks too (read, not run: no torch needed)."""
    for node in statements:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            yield from (n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            yield from ((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.If | ast.Try | ast.With):
            blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
            blocks += [handler.body for handler in getattr(node, "handlers", [])]
            for block in blocks:
                yield from module_level_names(block)


def test_every_name_a_benchmark_imports_from_gputop_is_there() -> None:
    """The benchmarks are run by hand, not by `make test`, and mypy does not read them (their jobs import torch
    and each other as scripts): `benchmarks/scale.py` imported a helper removed from gputop and stayed broken
    until a session ran it.  Each name they import from gputop must be a submodule or bound in the module."""
    missing = []
    files = sorted(BENCHMARKS.rglob("*.py"))
    for path in files:
        for module_name, name, line in gputop_names_imported(path):
            spec = importlib.util.find_spec(module_name)
            assert spec is not None and spec.origin, f"{path}:{line}: no module {module_name}"
            tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
            if (
                name not in set(module_level_names(tree.body))
                and importlib.util.find_spec(f"{module_name}.{name}") is None
            ):
                missing.append(f"{path.relative_to(BENCHMARKS.parent)}:{line}: {module_name}.{name}")
    assert len(files) > 20  # the benchmarks and their jobs are where this looks
    assert not missing, missing


ROOT = BENCHMARKS.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PATH_TOKEN = re.compile(r"^(?:gputop/|tests/|benchmarks/|docs/)?[\w/]+\.py$|^[\w]+/$")
MODULE_TOKEN = re.compile(r"^gputop(?:\.\w+)+$")


def named_in(doc: Path) -> set[str]:
    """What a doc names in code spans: `gputop/model/sums.py`, `model/sums.py`, `gputop.model.figures`."""
    return {token.strip() for token in re.findall(r"`([^`\n]+)`", doc.read_text(encoding="utf-8"))}


def path_exists(token: str) -> bool:
    """A file or folder named from the repository's root, or from inside gputop/ (``model/sums.py``), or a
    file's bare name somewhere in the package (``clock.py``)."""
    if (ROOT / token).exists() or (ROOT / "gputop" / token).exists():
        return True
    return "/" not in token.rstrip("/") and any((ROOT / "gputop").rglob(token.rstrip("/")))


def module_exists(token: str) -> bool:
    """A module of gputop, or a name bound in one (``gputop.address.resolve``)."""
    parts = token.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            spec = importlib.util.find_spec(".".join(parts[:cut]))
        except ModuleNotFoundError:  # a name under a module that is no package: look shorter
            continue
        if spec is not None and spec.origin:
            if cut == len(parts):
                return True
            return parts[cut] in set(module_level_names(ast.parse(Path(spec.origin).read_text("utf-8")).body))
    return False


def test_every_path_and_module_docs_architecture_names_exists() -> None:
    """docs/architecture.md is the newcomer's map: a file, folder or module it names that is gone (a renamed
    `live.py`) sends them looking for nothing."""
    named = named_in(ARCHITECTURE)
    paths = sorted(t for t in named if PATH_TOKEN.match(t) and not t.startswith(("torch/", "/")))
    modules = sorted(t for t in named if MODULE_TOKEN.match(t))
    assert len(paths) > 30 and len(modules) > 15  # the map is where this looks
    missing = [t for t in paths if not path_exists(t)] + [t for t in modules if not module_exists(t)]
    assert not missing, missing


def test_every_setting_docs_architecture_names_is_one() -> None:
    from gputop.settings import SETTINGS

    names = {s.env for s in SETTINGS}
    named = {t.split("=")[0] for t in named_in(ARCHITECTURE) if re.fullmatch(r"GPUTOP_[A-Z_]+(=\S*)?", t)}
    assert named, "the map names no setting"
    assert named <= names, sorted(named - names)


PACKAGE = ROOT / "gputop"
MAX_FUNCTION_LINES = 60  # one screen: a function past it does two things
MAX_MODULE_LINES = 400  # a module past it holds two subjects


def sizes() -> dict[str, int]:
    """Every module's lines and every function's, by "path" and "path:function", past the lines."""
    over = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(PACKAGE).as_posix()
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            over[name] = lines
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES:
                over[f"{name}:{node.name}"] = max(lines, over.get(f"{name}:{node.name}", 0))
    return over


def test_no_function_or_module_in_the_package_is_past_a_screen() -> None:
    over = sizes()
    assert not over, f"past {MAX_FUNCTION_LINES} lines a function or {MAX_MODULE_LINES} a module: {over}"
