"""Recordings: flushed per line, readable after a kill, bad files refused in one line."""

from __future__ import annotations

import json

import pytest

from gputop import recording
from gputop.model.samples import GpuSample, HostSample
from gputop.protocol import Bye, Hello, Window


def write_run(path, *, windows: int = 4, bye: bool = True) -> None:
    rec = recording.Recorder(path, source="test")
    rec.message(Hello(run_id="r", rank=0, world_size=1, loader_batch_size=8), 100.0)
    for i in range(1, windows + 1):
        rec.message(Window(run_id="r", rank=0, seq=i, t0=100 + i * 0.5, t1=100.5 + i * 0.5, steps=2,
                           step_total=2 * i, step_time_sum_s=0.4), 100.5 + i * 0.5)  # fmt: skip
    rec.sample(GpuSample(t=101.0, unavailable="NVML library not found"))
    rec.sample(HostSample(t=101.0, cpu_pct=50.0, per_core_pct=(40.0, 60.0)))
    if bye:
        rec.message(Bye(run_id="r", rank=0, t=103.0, step_total=2 * windows), 103.0)
    else:
        rec.disconnect("r", 0, "connection closed", 103.0)
    rec.close()


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
