"""``gputop report``: a recording summarised per rank, per GPU, with its findings; or two compared."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gputop.cli.common import UsageError, UserError

if TYPE_CHECKING:
    from gputop.collect.store import Store


def cmd_report(args: argparse.Namespace) -> int:
    from gputop import report

    if args.compare is not None:
        if args.recording is not None:
            raise UsageError("give one recording to report, or --compare BEFORE AFTER, not both")
        return compare(args.compare[0], args.compare[1], args.format)
    if args.recording is None:
        raise UsageError("which recording? gputop report RUN.jsonl, or gputop report --compare BEFORE AFTER")
    store, last_t, notes = load(args.recording)
    sys.stdout.write(report.render(store.snapshot(last_t, history=None), args.format, notes, args.gpu_hour_price))
    return 0


def load(path: Path) -> tuple[Store, float, list[str]]:
    """A recording's store and last time, with a note for each damaged line skipped; one line if unreadable."""
    from gputop.collect import recording

    stats = recording.ReadStats()
    try:
        store, last_t = recording.load(path, stats)
    except recording.RecordingError as exc:
        raise UserError(str(exc)) from None
    return store, last_t, [stats.note] if stats.note else []


def compare(before: Path, after: Path, fmt: str) -> int:
    from gputop.diagnose import diagnose
    from gputop.model.figures import summarize
    from gputop.report import compare as comparing

    figures = []
    for path in (before, after):
        store, last_t, notes = load(path)
        for note in notes:
            print(f"gputop: {path}: {note}", file=sys.stderr)
        figures.append(summarize(store.snapshot(last_t, history=None), span_s=None))
    data = comparing.compare(figures[0], figures[1], diagnose(figures[0]), diagnose(figures[1]))
    if fmt == "json":
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif fmt == "markdown":
        sys.stdout.write(comparing.to_markdown(data, before.name, after.name))
    else:
        sys.stdout.write(comparing.to_text(data, before.name, after.name))
    return 0
