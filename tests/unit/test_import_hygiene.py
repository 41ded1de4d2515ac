"""The three boundaries at run time: a cheap reporter, a torch-free dashboard, a pure model and diagnosis.

The same boundaries are import-linter contracts in pyproject.toml, checked
statically by `make check`; these prove what a fresh interpreter really loads.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def top_level(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_importing_gputop_in_a_training_process_is_cheap() -> None:
    loaded = modules_after("import gputop; gputop.watch")
    assert "gputop.reporter" in loaded
    assert not top_level(loaded) & {"torch", "textual", "rich", "psutil", "pynvml", "asyncio"}
    assert not {m for m in loaded if m.startswith(("gputop.collect", "gputop.tui", "gputop.diagnose"))}
    # Its settings come from the registry; the config file (TOML) is the dashboard's to read.
    assert "gputop.settings" in loaded
    assert not {"gputop.settings.config_file", "tomllib", "tomli"} & loaded


def test_the_dashboard_never_loads_the_reporter() -> None:
    assert not {m for m in modules_after("import gputop.cli, gputop.collect.live") if m.startswith("gputop.reporter")}


@pytest.mark.parametrize(
    "module", ["gputop.cli", "gputop.collect.live", "gputop.tui.app", "gputop.report", "gputop.collect.recording"]
)
def test_the_dashboard_side_never_imports_torch(module: str) -> None:
    assert "torch" not in top_level(modules_after(f"import {module}"))


def test_building_the_cli_parser_does_not_import_torch() -> None:
    assert "torch" not in top_level(modules_after("from gputop.cli import build_parser; build_parser()"))


@pytest.mark.parametrize("module", ["gputop.diagnose", "gputop.model.figures", "gputop.model.source"])
def test_the_model_and_the_diagnosis_are_pure(module: str) -> None:
    loaded = modules_after(f"import {module}")
    # What the wire format's own import loads is not the model's doing: on Python 3.10 msgspec's
    # `import uuid` brings platform, subprocess and with them threading (3.11's uuid no longer does).
    wire = modules_after("import msgspec")
    assert not top_level(loaded - wire) & {"torch", "textual", "psutil", "pynvml", "socket", "asyncio", "threading"}
    assert not {m for m in loaded if m.startswith(("gputop.collect", "gputop.tui", "gputop.reporter"))}


def test_the_node_sampler_loads_nvml_code_but_no_reporter_dashboard_or_torch() -> None:
    loaded = modules_after("import gputop.node.sampler")
    assert "gputop.collect.gpu.sampler" in loaded
    assert not top_level(loaded) & {"torch", "textual", "rich"}
    assert not {m for m in loaded if m.startswith(("gputop.reporter", "gputop.tui", "gputop.diagnose"))}


def test_printing_the_fleet_once_loads_no_screen() -> None:
    """`gputop fleet URL --format json` in a pipe or a cron job: the reads load neither Textual nor the model."""
    loaded = modules_after("import gputop.cli.fleet, gputop.fleet.node")
    assert not top_level(loaded) & {"torch", "textual", "rich"}
    assert not {m for m in loaded if m.startswith(("gputop.tui", "gputop.model", "gputop.diagnose"))}
