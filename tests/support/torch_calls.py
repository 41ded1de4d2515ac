"""The collectives a stack's own source calls, read from the installed torch without running it.

FSDP2 calls ``dist.<name>`` and DTensor ``funcol.<name>`` at call time, and each torch release has renamed some
(``all_gather_into_tensor`` became an alias of 2.13's ``all_gather_single``).  ``collectives_called`` reads the
stack's modules with ``ast`` and names every call of a collective of ``torch.distributed`` (a function of
``distributed_c10d`` that takes ``async_op``, or a point-to-point one) or of the functional collectives (a function
of ``_functional_collectives`` that takes a ``group``), however the module imported it.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import ModuleType

C10D = "torch.distributed.distributed_c10d"
FUNCOL = "torch.distributed._functional_collectives"
POINT_TO_POINT = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv"})
# The stacks read, as folders inside the torch package: FSDP2 (where each release keeps it) and DTensor.
STACKS = {
    "FSDP2": ("distributed/fsdp/_fully_shard", "distributed/_composable/fsdp"),
    "DTensor": ("distributed/tensor", "distributed/_tensor"),
}


def collective_names(module: ModuleType, *, functional: bool) -> frozenset[str]:
    """The functions of ``module`` that issue a collective (see the module's docstring)."""
    found = set()
    for name, value in vars(module).items():
        if not inspect.isfunction(value) or value.__module__ != module.__name__:
            continue
        try:
            parameters = inspect.signature(value).parameters
        except (TypeError, ValueError):
            continue
        if functional and name.startswith("_"):  # its helpers (``_resolve_group``) take a group too
            continue
        if ("group" in parameters) if functional else ("async_op" in parameters or name in POINT_TO_POINT):
            found.add(name)
    return frozenset(found)


def _aliases(tree: ast.Module) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """A module's imports: local name -> module it stands for, and local name -> (module, function) imported."""
    modules: dict[str, str] = {}
    functions: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                modules[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in (C10D, FUNCOL, "torch.distributed"):
                    modules[alias.asname or alias.name] = full
                else:
                    functions[alias.asname or alias.name] = (node.module, alias.name)
    return modules, functions


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def calls_in(source: str) -> set[tuple[str, str]]:
    """Every (module, function) a source calls through ``torch.distributed``, ``distributed_c10d`` or the functional
    collectives, as ``torch.distributed`` / ``C10D`` / ``FUNCOL`` and the function's name."""
    tree = ast.parse(source)
    modules, functions = _aliases(tree)
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        target = _dotted(node.func)
        if target is None:
            continue
        head, _, name = target.rpartition(".")
        if not head and target in functions:
            head, name = functions[target]
        else:
            first, _, rest = head.partition(".")
            head = modules.get(first, first) + (f".{rest}" if rest else "")
        if head in ("torch.distributed", C10D, FUNCOL):
            found.add((FUNCOL if head == FUNCOL else "torch.distributed", name))
    return found


def collectives_called(torch: ModuleType, c10d: ModuleType, funcol: ModuleType) -> dict[str, dict[str, set[str]]]:
    """Per stack, the collectives its source calls: {"FSDP2": {"torch.distributed": {...}, FUNCOL: {...}}}."""
    root = Path(str(torch.__file__)).parent
    kinds = {
        "torch.distributed": collective_names(c10d, functional=False),
        FUNCOL: collective_names(funcol, functional=True),
    }
    result: dict[str, dict[str, set[str]]] = {}
    for stack, folders in STACKS.items():
        called: dict[str, set[str]] = {"torch.distributed": set(), FUNCOL: set()}
        for folder in folders:
            for path in sorted((root / folder).rglob("*.py")):
                for module, name in calls_in(path.read_text(encoding="utf-8")):
                    if name in kinds[module]:
                        called[module].add(name)
        result[stack] = called
    return result


def compute_stream_waits(torch: ModuleType) -> set[tuple[str, str]]:
    """Where FSDP2's source makes the current (compute) stream wait for an event: (module file's stem, the function
    around the call), for each ``….current_stream().wait_event(…)``, or ``wait_event`` on a name bound to one."""
    root = Path(str(torch.__file__)).parent
    sites: set[tuple[str, str]] = set()
    for folder in STACKS["FSDP2"]:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for function in ast.walk(tree):
                if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    sites |= {(path.stem, function.name) for _ in _stream_waits(function)}
    return sites


def _stream_waits(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Call]:
    """The calls in ``function``'s own body (not its nested functions') that make the current stream wait."""

    def current_stream(node: ast.expr) -> bool:
        return (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "current_stream"
        )

    nodes = list(_own_nodes(function))
    bound = {
        target.id
        for node in nodes
        if isinstance(node, ast.Assign) and current_stream(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return [
        node
        for node in nodes
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "wait_event"
        and (current_stream(node.func.value) or (isinstance(node.func.value, ast.Name) and node.func.value.id in bound))
    ]


def _own_nodes(function: ast.AST) -> list[ast.AST]:
    found: list[ast.AST] = []
    for child in ast.iter_child_nodes(function):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            found.append(child)
            found.extend(_own_nodes(child))
    return found
