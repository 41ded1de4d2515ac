"""Recordings: flushed per line, readable after a kill, bad files refused in one line."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gputop.collect import recording
from gputop.protocol import Bye, Hello
from tests.support.recordings import write_run


def test_everything_written_reads_back(tmp_path) -> None:
    path = tmp_path / "run.jsonl"
    write_run(path)
    store, last_t = recording.load(path)
    snap = store.snapshot(last_t)
    (view,) = snap.all_ranks()
    assert len(view.windows) == 4 and view.status == "done"
    assert snap.gpu is not None and snap.gpu.unavailable == "NVML library not found"
    assert snap.host is not None and snap.host.per_core_pct == (40.0, 60.0)


def test_a_killed_recorder_leaves_a_readable_file(tmp_path) -> None:
    path = tmp_path / "run.jsonl"
    write_run(path, bye=False)
    with open(path, "a") as f:
        f.write('{"v":1,"type":"window","run_id":"r","ra')  # the write the kill interrupted
    stats = recording.ReadStats()
    store, last_t = recording.load(path, stats)
    (view,) = store.snapshot(last_t).all_ranks()
    assert len(view.windows) == 4
    assert view.status == "lost"
    assert stats.skipped == 1


def test_each_line_is_on_disk_as_soon_as_it_is_written(tmp_path) -> None:
    path = tmp_path / "run.jsonl"
    rec = recording.Recorder(path, source="test")
    rec.message(Hello(run_id="r", rank=0), 1.0)
    lines = path.read_text().splitlines()  # before close()
    assert json.loads(lines[-1])["type"] == "hello"
    rec.close()


@pytest.mark.parametrize("content", ["", "hello\n", '{"type": "window"}\n'])
def test_a_file_that_is_not_a_recording_is_refused(tmp_path, content: str) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text(content)
    with pytest.raises(recording.RecordingError, match="not a gputop recording"):
        recording.load(path)


def test_a_missing_file_is_a_one_line_error(tmp_path) -> None:
    with pytest.raises(recording.RecordingError, match="cannot read"):
        recording.load(tmp_path / "nope.jsonl")


def test_merged_windows_report_what_the_full_recording_reports(tmp_path) -> None:
    """`record --merge-after 0`: 20x fewer window lines, and `gputop report` says the same per rank."""
    from gputop import report
    from tests.support.diagnose_fixtures import T0, RankSpec, rank_windows

    specs = [RankSpec(rank=0, step_s=0.1, loader_frac=0.3), RankSpec(rank=1, step_s=0.05, comm_frac=0.4)]
    reports, window_lines = [], []
    for name, merge_after_s in (("full.jsonl", None), ("merged.jsonl.gz", 0.0)):
        path = tmp_path / name
        recorder = recording.Recorder(path, source="test", merge_after_s=merge_after_s)
        recorder.started_t = T0  # the recording's clock is the fixture's
        for spec in specs:
            recorder.message(Hello(run_id="r", rank=spec.rank, world_size=2, loader_batch_size=8), T0)
            windows = rank_windows(spec, "r", seconds=120, t_end=T0 + 120)
            for window in windows:
                recorder.message(window, window.t1)
            recorder.message(Bye(run_id="r", rank=spec.rank, t=T0 + 120, step_total=windows[-1].step_total), T0 + 120)
        recorder.close()
        store, last_t = recording.load(path)
        window_lines.append(sum(len(v.windows) for v in store.snapshot(last_t, history=None).all_ranks()))
        reports.append(json.loads(report.render(store.snapshot(last_t, history=None), "json")))
    full, merged = reports
    assert window_lines[1] * 19 <= window_lines[0], window_lines
    _assert_same_ranks(full, merged)
    assert [f["cause"] for f in full["findings"]] == [f["cause"] for f in merged["findings"]]


def _assert_same_ranks(full: dict[str, Any], merged: dict[str, Any]) -> None:
    """Every per-rank figure of the report equal (floats within 2%: p50/p95 become step-weighted means)."""
    for a, b in zip(full["runs"][0]["ranks"], merged["runs"][0]["ranks"], strict=True):
        for key, value in a.items():
            other = b[key]
            if isinstance(value, float) and isinstance(other, float):
                assert other == pytest.approx(value, rel=0.02, abs=1e-9), key
            elif key != "windows":
                assert other == value, key


def test_refreshes_feed_the_recording_at_its_own_pace_and_go_on_past_its_end(tmp_path) -> None:
    """A live view's refreshes over a recording: each sees what had arrived by its time, and no more."""
    path = tmp_path / "run.jsonl"
    write_run(path, windows=4)  # hello at 100.0, windows received at 101.0, 101.5, 102.0, 102.5, bye at 103.0
    seen = [(t, sum(len(v.windows) for v in store.snapshot(t).all_ranks()))
            for t, store in recording.refreshes(path, 0.5, past_end_s=1.0)]  # fmt: skip
    assert [t for t, _ in seen] == pytest.approx([100.5 + 0.5 * i for i in range(8)])
    assert [n for _, n in seen] == [0, 1, 2, 3, 4, 4, 4, 4]
