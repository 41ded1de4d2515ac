"""What gputop reads of each stack under one torch release: real 2-rank jobs on gloo, and a table made of them.

    python benchmarks/torch_matrix.py            # run the jobs under this Python's torch; write its JSON, the table
    python benchmarks/torch_matrix.py --table    # only make docs/torch.md's table again from the JSON files

``make test-torch TORCH=2.11.0`` runs it in that release's venv after the stacks' tests (scripts/test-torch).  Each
release's figures go to ``benchmarks/results/torch/RELEASE.json``; docs/torch.md's table, between its marker
comments, is made from every file there, so no one types it.  tests/unit/test_torch_matrix.py fails where the
table in the docs is not what the files make.

The jobs are the suite's own (tests/support/jobs): DDP, pytorch/examples' FSDP2 pattern, its 2-D pattern (tensor
parallel MLPs inside FSDP2 blocks) and a DDP model compiled after it was watched.  A cell says what reached the
collector: the collectives by kind and group with their exposed milliseconds a step, the phases' source, MFU,
and for the compiled job its recompiles and the frames of gputop's that dynamo compiled (none, ever).
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "torch"
DOC = ROOT / "docs" / "torch.md"
BEGIN, END = "<!-- torch-matrix:begin -->", "<!-- torch-matrix:end -->"
# (column, job and its arguments)
JOBS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("DDP", ("ddp_job.py", "--steps", "30")),
    ("FSDP2", ("fsdp2_job.py", "--steps", "20")),
    ("FSDP2 + TP", ("fsdp2_job.py", "--tp", "--steps", "20")),
    ("compile after watch", ("compile_job.py", "--compile", "after", "--shapes", "1", "--steps", "30")),
)


def run_job(args: tuple[str, ...]) -> tuple[Any, str]:
    """One job beside a real collector: its whole-run figures and its output."""
    from gputop.address import Address
    from gputop.collect.server import Collector
    from gputop.collect.store import Store
    from gputop.model.figures import summarize
    from gputop.model.snapshot import DONE
    from tests.support.collectors import snapshot_of, wait_for
    from tests.support.processes import launch

    collector = Collector(Store(), Address(port=0))
    collector.start()
    try:
        job = launch(*args, port=collector.address.port)
        out, _ = job.communicate(timeout=300)
        if job.returncode != 0:
            errors = [line for line in out.splitlines() if "Error: " in line]
            raise RuntimeError(errors[-1].split("]: ", 1)[-1] if errors else f"exited {job.returncode}")
        wait_for(lambda: all(v.status == DONE for v in snapshot_of(collector).all_ranks()), timeout_s=30)
        return summarize(snapshot_of(collector), span_s=None), out
    finally:
        collector.stop()


def read(figures: Any, out: str) -> dict[str, Any]:
    """What rank 0 reported: its collectives (exposed ms a step), phases' source, forward ms, MFU, compiles."""
    from gputop import report

    stats = figures.all_ranks()[0].stats
    (run,) = report.build(figures, [])["runs"]
    compiled = re.search(r"recompiles (\d+) gputop (\[[^\]]*\])", out)
    return {
        "steps": stats.steps,
        "phases": stats.phases.source,
        "forward_ms": _ms(stats.phases.forward_s),
        "collectives": [
            {"name": c.name, "calls": round(c.calls, 1), "exposed_ms": _ms(c.exposed_s)} for c in stats.collectives
        ],
        "mfu_pct": _rounded(run["ranks"][0].get("mfu_pct")),
        "recompiles": int(compiled.group(1)) if compiled else None,
        "gputop_frames_compiled": json.loads(compiled.group(2).replace("'", '"')) if compiled else None,
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else float(f"{value:.2g}")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1e3 * seconds, 2)


def run_all() -> dict[str, Any]:
    import torch

    stacks: dict[str, Any] = {}
    for column, args in JOBS:
        start = time.monotonic()
        try:
            stacks[column] = read(*run_job(args))
        except Exception as exc:
            stacks[column] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        stacks[column]["seconds"] = round(time.monotonic() - start, 1)
        print(f"{column}: {stacks[column]}", flush=True)
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {platform.node()}",
        "when_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "stacks": stacks,
    }


def cell(figures: dict[str, Any]) -> str:
    """One stack's cell: what was read, in a few words."""
    if "error" in figures:
        return f"**failed**: {figures['error'][:120]}"
    if figures.get("recompiles") is not None:
        frames = figures["gputop_frames_compiled"]
        ours = "none of gputop's" if not frames else f"**gputop's {', '.join(frames)}**"
        return f"{figures['recompiles']} recompiles, {ours} compiled; {figures['steps']} steps"
    read = [f"{c['name']} {_said_ms(c['exposed_ms'])}" for c in figures["collectives"]]
    words = "; ".join(read) if read else "**no collective read**"
    forward = _said_ms(figures["forward_ms"])
    mfu = "" if figures["mfu_pct"] is None else f", MFU {figures['mfu_pct']:g}%"
    return f"{words}; forward {forward} ({figures['phases']}){mfu}"


def _said_ms(ms: float | None) -> str:
    return "N/A" if ms is None else f"{ms:g} ms"


def table(results: list[dict[str, Any]]) -> str:
    columns = [column for column, _ in JOBS]
    lines = [
        "| torch (Python) | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for result in sorted(results, key=lambda r: _release_key(r["torch"])):
        cells = [cell(result["stacks"][c]) if c in result["stacks"] else "not run" for c in columns]
        lines.append(f"| {result['torch']} ({result['python']}), {result['when_utc']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _release_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def made_doc(doc: str, results: list[dict[str, Any]]) -> str:
    head, _, rest = doc.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{table(results)}\n{END}{tail}"


def load_results() -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(RESULTS.glob("*.json"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--table", action="store_true", help="only make the table again from the JSON files")
    args = parser.parse_args(argv)
    if not args.table:
        result = run_all()
        RESULTS.mkdir(parents=True, exist_ok=True)
        release = result["torch"].split("+")[0]
        (RESULTS / f"{release}.json").write_text(json.dumps(result, indent=1) + "\n")
    DOC.write_text(made_doc(DOC.read_text(), load_results()))
    print(table(load_results()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
