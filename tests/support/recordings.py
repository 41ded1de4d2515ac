"""Recordings written by the real recorder: a small run for the CLI and replay, steady ranks for compare and waste."""

from __future__ import annotations

from pathlib import Path

from gputop.collect import recording
from gputop.model.samples import GpuSample, HostSample
from gputop.protocol import Bye, Hello, Window
from tests.support.diagnose_fixtures import T0, RankSpec, rank_windows


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


def record(path: Path, specs: list[RankSpec], *, seconds: float = 20.0) -> Path:
    """A recording of two ranks in a steady state, written by the real recorder."""
    rec = recording.Recorder(path, source="test")
    for spec in specs:
        facts = {"world_size": len(specs), "pid": 100 + spec.rank, "loader_batch_size": 64, "cpu_count": 16}
        rec.message(Hello(run_id="run", rank=spec.rank, **{**facts, **spec.hello}), T0)
        for window in rank_windows(spec, "run", seconds=seconds, t_end=T0 + seconds):
            rec.message(window, window.t1)
    rec.close()
    return path
