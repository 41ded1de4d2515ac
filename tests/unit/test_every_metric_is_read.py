"""Adding a metric touches few places, and none is forgotten (docs/architecture.md, "Adding a metric").

``gputop.combine`` names every Window field (its combination rule) and so is no
reader: a field must reach the model's figures, and a figure a view, a report or
a rule.

A ``Window`` field that the dashboard side reads nowhere is a measurement the
reporter pays for and the user never sees; a ``RankStats`` figure that no
view, report or rule reads is arithmetic for nobody.  Both are read from the
source (attribute names and the string names passed to ``getattr``), so the
test fails the moment a field is added without its reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import msgspec

from gputop.combine import PHASES
from gputop.model.rank_stats import RankStats
from gputop.protocol import Window

PACKAGE = Path(__file__).resolve().parents[2] / "gputop"
DASHBOARD_SIDE = ["model", "diagnose", "tui", "collect", "report"]
SHOWN_BY = ["tui", "diagnose", "report", "model/figures.py"]  # where figures reach the user


def names_read(paths: list[Path], *, skip: Path | None = None) -> set[str]:
    """Attribute names accessed, and string constants (``getattr(w, "rss_bytes")``), in these files.

    An attribute of an attribute or of a name is also found with it, dotted: ``stats.cpu.pct`` reads "cpu.pct",
    ``cpu.pct`` too, so a group's figure is found by its group and its name.
    """
    found: set[str] = set()
    for root in paths:
        assert root.exists(), f"{root} is gone: say where its code went"
        for path in [root] if root.is_file() else sorted(root.rglob("*.py")):
            if path == skip:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                    found.add(node.attr)
                    if isinstance(node.value, ast.Attribute):
                        found.add(f"{node.value.attr}.{node.attr}")
                    elif isinstance(node.value, ast.Name):
                        found.add(f"{node.value.id}.{node.attr}")
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    found.add(node.value)
    return found


def names_used(root: Path) -> set[str]:
    """The plain names (imported functions and constants) these files use."""
    assert root.exists(), f"{root} is gone: say where its code went"
    return {
        node.id
        for path in ([root] if root.is_file() else sorted(root.rglob("*.py")))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Name)
    }


def figure_names() -> list[str]:
    """Every figure of ``RankStats``: a group's by its group and its name ("cpu.pct"), the others by theirs."""
    names = []
    for field in msgspec.structs.fields(RankStats):
        if isinstance(field.type, type) and issubclass(field.type, msgspec.Struct):
            names += [f"{field.name}.{leaf.name}" for leaf in msgspec.structs.fields(field.type)]
        else:
            names.append(field.name)
    return names


def window_properties_read() -> set[str]:
    """Fields read by the message classes' own methods (``timed`` reads ``timed_steps``)."""
    tree = ast.parse((PACKAGE / "protocol" / "run.py").read_text(encoding="utf-8"))
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in ("Window", "_Message")]
    return {
        node.attr
        for cls in classes
        for fn in cls.body
        if isinstance(fn, ast.FunctionDef)
        for node in ast.walk(fn)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
    }


def test_every_window_field_is_read_on_the_dashboard_side() -> None:
    # The model sums a phase's Window field through its declaration (gputop.combine.PHASES):
    # the DDP means by DDP_FIGURES, the totals over the timed steps by TIMED_PHASES.
    assert {"DDP_FIGURES", "TIMED_PHASES"} <= names_used(PACKAGE / "model")
    declared = {p.seconds for p in PHASES}
    read = names_read([PACKAGE / p for p in DASHBOARD_SIDE]) | window_properties_read() | declared
    codec = {"v"}  # the protocol version: the decoder checks it, no figure reads it
    unread = [f.name for f in msgspec.structs.fields(Window) if f.name not in read | codec]
    assert unread == [], f"Window fields no dashboard code reads: {unread}; see docs/architecture.md, adding a metric"


def test_every_rank_figure_reaches_a_view_a_report_or_a_rule() -> None:
    # A step's phases reach the phase bars, the report, the exporter and the straggler rule through their
    # one declaration (gputop.combine.PHASES), which those views iterate: a phase declared there is shown.
    assert {"PHASES", "phase_seconds"} <= names_used(PACKAGE / "tui") and "OWN_PHASES" in names_used(PACKAGE / "report")
    read = names_read([PACKAGE / p for p in SHOWN_BY]) | {f"phases.{p.seconds}" for p in PHASES}
    unread = [name for name in figure_names() if name not in read]
    assert unread == [], f"RankStats figures nothing shows or judges: {unread}"


def test_the_check_sees_a_field_nobody_reads(tmp_path: Path) -> None:
    reader = tmp_path / "reader.py"
    reader.write_text("def f(w):\n    return w.steps + getattr(w, 'rss_bytes')\n", encoding="utf-8")
    assert {"steps", "rss_bytes"} <= names_read([reader])
    assert "threads" not in names_read([reader])
