"""HostSampler on this machine's real psutil, with a real rank process and a busy worker child."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from gputop.collect import host
from gputop.collect.host import HostSampler
from gputop.model.samples import ProcessReading
from gputop.processes.procfs import cpu_ticks

# A stand-in rank: spawns one busy "DataLoader worker", prints its pid, then idles.
RANK_SCRIPT = """
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, "-c", "while True: pass"])
print(worker.pid, flush=True)
time.sleep(60)
"""


@pytest.fixture
def rank() -> Iterator[tuple[subprocess.Popen[str], int]]:
    proc = subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    worker_pid = int(proc.stdout.readline())
    yield proc, worker_pid
    for pid in (worker_pid, proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def reading_until(sampler: HostSampler, pid: int, ok: object, deadline_s: float = 10.0) -> ProcessReading:
    """Sample until the rank's reading satisfies ``ok`` (a condition, not a timing assertion)."""
    end = time.monotonic() + deadline_s
    while True:
        got = {p.pid: p for p in sampler.sample().processes}.get(pid)
        if got is not None and ok(got):  # type: ignore[operator]
            return got
        assert time.monotonic() < end, f"never got the expected reading; last: {got}"
        time.sleep(0.1)


# A process whose name looks like the end of /proc/<pid>/stat's "(comm)" field, that spins, then idles.
ODDLY_NAMED = (
    "import ctypes, time; "
    "ctypes.CDLL(None).prctl(15, b'a) b (c', 0, 0, 0); "  # PR_SET_NAME
    "end = time.process_time() + 1.0\n"
    "while time.process_time() < end: pass\n"
    "time.sleep(60)"
)


class TestBusyProcesses:
    """The machine's busiest processes, from one read of each /proc/<pid>/stat a sample."""

    def test_cpu_ticks_reads_each_process_name_and_time_as_psutil_does(self) -> None:
        child = subprocess.Popen([sys.executable, "-c", ODDLY_NAMED])
        try:
            ticks_per_s = os.sysconf("SC_CLK_TCK")
            end = time.monotonic() + 10
            while psutil.Process(child.pid).status() != psutil.STATUS_SLEEPING or cpu_ticks()[child.pid][0] == 0:
                assert time.monotonic() < end, "the child never got to its sleep"
                time.sleep(0.05)
            ticks, name = cpu_ticks()[child.pid]
            assert name == "a) b (c"
            times = psutil.Process(child.pid).cpu_times()
            assert ticks == round((times.user + times.system) * ticks_per_s)
        finally:
            child.kill()
            child.wait()

    def test_a_spinning_process_is_named_with_its_share_of_a_core(
        self, rank: tuple[subprocess.Popen[str], int]
    ) -> None:
        _, worker_pid = rank
        sampler = HostSampler()
        end = time.monotonic() + 10
        while True:
            worker = next((p for p in sampler.sample().busy if p.pid == worker_pid), None)
            if worker is not None:
                break
            assert time.monotonic() < end, "the spinning worker was never among the busy processes"
            time.sleep(0.3)
        assert worker.name == psutil.Process(worker_pid).name()
        assert worker.cpu_pct >= 20  # it spins; on a loaded machine it still gets a good share

    def test_the_busy_list_is_read_every_five_seconds_and_repeated_between(
        self, rank: tuple[subprocess.Popen[str], int], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Each read opens every process's stat file: once per BUSY_EVERY_S, not once a sample."""
        _, worker_pid = rank
        reads: list[float] = []
        now = [time.time()]
        monkeypatch.setattr(host, "cpu_ticks", lambda: (reads.append(now[0]), cpu_ticks())[1])
        sampler = HostSampler(clock=lambda: now[0])
        samples = []
        for _ in range(12):  # twelve samples a second apart, while the worker spins
            time.sleep(0.25)
            now[0] += 1.0
            samples.append(sampler.sample())
        assert len(reads) == 4, reads  # when built, then at 1 s, 6 s and 11 s (on the injected clock)
        assert samples[1].busy == samples[0].busy  # between reads, the last one repeated
        assert any(p.pid == worker_pid for p in samples[-1].busy), samples[-1].busy

    def test_a_program_started_between_reads_is_rated_over_its_own_life(self) -> None:
        """A neighbour started after the last read burns a core: it reads near 100%, not its share of the 5 s."""
        now = [time.time()]
        sampler = HostSampler(clock=lambda: now[0])
        sampler.sample()  # the first read: before the program exists
        loop = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        started = time.monotonic()
        try:
            time.sleep(1.5)
            now[0] += 5.0  # the next read is due; the program ran the last 1.5 s of those 5
            busy = {p.pid: p for p in sampler.sample().busy}
            times = psutil.Process(loop.pid).cpu_times()
            used = 100 * (times.user + times.system) / (time.monotonic() - started)  # its share of a core, really
        finally:
            loop.kill()
            loop.wait()
        assert loop.pid in busy, busy
        # Rated over its own 1.5 s, about what it used (a core alone, less on 2 shared cores); over the 5 s
        # since the last read it would be 30% of that.
        assert busy[loop.pid].cpu_pct > 0.7 * used, (busy[loop.pid], used)
        assert busy[loop.pid].wait_pct is not None and busy[loop.pid].wait_pct >= 0  # its run-queue wait, read too
        assert busy[loop.pid].command == f"{sys.executable} -c while True: pass"  # its command line, as top's `c`


class TestRankProcesses:
    """Per-rank CPU and memory, with DataLoader workers counted as the rank's."""

    def test_worker_child_is_counted_and_its_cpu_summed(self, rank: tuple[subprocess.Popen[str], int]) -> None:
        proc, worker_pid = rank
        sampler = HostSampler(lambda: [proc.pid])

        first = {p.pid: p for p in sampler.sample().processes}[proc.pid]
        assert first.cpu_pct is None  # no previous reading yet: unknown, not 0
        assert first.rss_bytes is not None and first.rss_bytes > 0
        assert first.children == 1 and first.child_pids == (worker_pid,)

        busy = reading_until(sampler, proc.pid, lambda r: (r.children_cpu_pct or 0) > 20)
        assert busy.cpu_pct is not None and busy.children_cpu_pct is not None
        assert busy.cpu_pct < busy.children_cpu_pct  # the rank idles, its worker spins

    def test_vanished_processes_are_dropped_silently(self, rank: tuple[subprocess.Popen[str], int]) -> None:
        proc, worker_pid = rank
        sampler = HostSampler(lambda: [proc.pid])
        sampler.sample()

        os.kill(worker_pid, signal.SIGKILL)
        reading = reading_until(sampler, proc.pid, lambda r: r.children == 0)
        assert reading.child_pids == ()

        proc.kill()
        proc.wait()
        assert sampler.sample().processes == ()

    def test_unknown_pid_and_failing_pid_source(self) -> None:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        assert HostSampler(lambda: [dead.pid]).sample().processes == ()

        def broken() -> list[int]:
            raise RuntimeError("snapshot failed")

        sample = HostSampler(broken).sample()
        assert sample.processes == () and sample.mem_total_bytes
