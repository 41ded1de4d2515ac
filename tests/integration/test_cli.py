"""The CLI run for seconds as a user runs it: `gputop record` to the end or to SIGTERM, `gputop demo`'s real job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.support.collectors import wait_for
from tests.support.processes import free_port, gputop, needs_torch


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "killed"])
def test_the_demo_job_never_outlives_gputop(sig: int) -> None:
    """Ctrl-C cleans up; even a gputop killed outright (a closed terminal, kill -9) takes its job with it."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "gputop", "demo", "--headless", "--seconds", "120"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    parent = psutil.Process(demo.pid)

    def ranks() -> list[psutil.Process]:
        try:
            return [p for p in parent.children(recursive=True) if "gputop.demos.train" in " ".join(p.cmdline())]
        except psutil.Error:
            return []

    assert wait_for(lambda: len(ranks()) >= 3, timeout_s=60)  # torchrun and its 2 ranks
    job = parent.children(recursive=True)
    demo.send_signal(sig)
    demo.wait(30)
    _, alive = psutil.wait_procs(job, timeout=60)  # torchrun gives its ranks 30 s to stop
    for proc in alive:
        proc.kill()
    assert alive == [], [p.cmdline() for p in alive]


@needs_torch
@pytest.mark.slow
def test_demo_ranks_leave_with_their_demo_even_when_torchrun_does_not_stop_them() -> None:
    """torchrun can lose its ranks to a SIGTERM that lands while it starts them: they leave on their own.

    The demo process is stood in for by a sleeper; torchrun is never signalled.
    """
    from gputop.demos.teardown import DEMO_PID_ENV, LEFT_WITH_THE_DEMO

    demo = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    env = {**os.environ, DEMO_PID_ENV: str(demo.pid), "GPUTOP_DISABLE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "gputop.demos.train", "--seconds", "120"]  # fmt: skip
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        torchrun = psutil.Process(job.pid)
        assert wait_for(lambda: len(torchrun.children()) == 2, timeout_s=60), "no ranks started"
        ranks = torchrun.children()
        time.sleep(3)  # into their imports or their first steps
        assert all(r.is_running() for r in ranks) and job.poll() is None, "the job ended with its demo alive"
        demo.kill()
        demo.wait()
        _, alive = psutil.wait_procs(ranks, timeout=20)
        assert alive == [], f"ranks {[p.pid for p in alive]} outlived their demo by 20 s"
        out, _ = job.communicate(timeout=60)  # torchrun, which nobody signalled, sees them fail
        assert f"exitcode  : {LEFT_WITH_THE_DEMO}" in out, out[-3000:]
    finally:
        for proc in (demo, job):
            proc.kill()
            proc.wait()


def test_record_without_a_gpu_keeps_host_samples_and_says_why_no_gpu(tmp_path) -> None:
    out = tmp_path / "r.jsonl"
    port = free_port()
    result = gputop("record", "--port", str(port), "--seconds", "2.5", "--interval", "0.5", "-o", str(out))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["type"] == "recording"
    hosts = [x for x in lines if x["type"] == "host"]
    gpus = [x for x in lines if x["type"] == "gpu"]
    assert len(hosts) >= 2 and hosts[-1]["cpu_pct"] is not None and hosts[-1]["mem_total_bytes"] > 0
    assert gpus and all(g["unavailable"] or g["gpus"] for g in gpus)
    report = gputop("report", str(out))
    assert report.returncode == 0 and "No run reported" in report.stdout


def test_record_stopped_by_sigterm_closes_its_recording_whole(tmp_path) -> None:
    """What a scheduler or `kill` sends: the summary line, exit 0, and a .gz stream with its end."""
    import gzip

    out = tmp_path / "r.jsonl.gz"
    port = free_port()
    cmd = [sys.executable, "-m", "gputop", "record", "--port", str(port), "--seconds", "60", "--interval", "0.2"]
    proc = subprocess.Popen([*cmd, "-o", str(out)], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        assert "recording" in proc.stderr.readline()  # listening, and SIGTERM now stops it
        time.sleep(1.0)  # a few host samples
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "wrote" in err, err
    with gzip.open(out, "rt") as stream:  # EOFError if the stream has no end
        lines = [json.loads(line) for line in stream]
    assert lines[0]["type"] == "recording" and any(x["type"] == "host" for x in lines)
