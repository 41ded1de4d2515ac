"""A real recorder process killed mid-run: its gzip recording keeps what was flushed."""

from __future__ import annotations

from gputop.collect import recording


def test_a_gz_recording_is_compressed_and_what_was_flushed_survives_a_kill(tmp_path) -> None:
    """A recorder SIGKILLed mid-stream: the gzip stream has no end, every flushed window still reads back."""
    import os
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "run.jsonl.gz"
    writer = f"""
import time
from pathlib import Path
from gputop.collect.recording import Recorder
from gputop.protocol import Hello, Window
r = Recorder(Path({str(path)!r}), source="test")
r.message(Hello(run_id="r", rank=0), 1.0)
for i in range(1, 10**7):
    r.message(Window(run_id="r", rank=0, seq=i, t0=i, t1=i + 0.5, steps=1, step_total=i), i)
    if i % 100 == 0:
        print(i, flush=True)
        time.sleep(0.01)
"""
    proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
    time.sleep(recording.GZIP_FLUSH_S * 2.5)
    os.kill(proc.pid, signal.SIGKILL)
    written = max(int(line) for line in proc.communicate()[0].split())
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    stats = recording.ReadStats()
    store, last_t = recording.load(path, stats)
    (view,) = store.snapshot(last_t, history=None).all_ranks()
    seqs = [w.seq for w in view.windows]
    assert seqs == list(range(1, len(seqs) + 1)), "a gap or a repeat in what read back"
    assert len(seqs) >= 100 and len(seqs) <= written + 100
    assert path.stat().st_size < 40 * len(seqs), "not compressed"  # a window line is ~110 bytes of JSON
