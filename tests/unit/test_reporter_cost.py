"""What issue #35 made cheaper in the reporter still does what it did: the step mark, the process probe, the ticks."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from gputop.address import Address
from gputop.reporter.clock import StepClock
from gputop.reporter.probes import process
from gputop.reporter.probes.process import ProcessProbe
from gputop.reporter.reporter import Reporter

LINUX_PROC = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _steps(clock: StepClock, combined: bool, steps: int = 4) -> list[Any]:
    """Steps as the optimizer's hooks mark them: timed from the pre-hook, marked at the post-hook."""
    for _ in range(steps):
        clock.add_loader_wait(0.001)
        clock.forward_end_s = time.perf_counter()
        clock.optimizer_started()
        time.sleep(0.002)
        if combined:
            clock.optimizer_done(True)
        else:
            clock.optimizer_done()
            clock.mark_step()
    return clock.drain()


@pytest.mark.parametrize("phases", [False, True])
def test_the_post_hooks_one_call_marks_the_step_as_two_calls_did(phases: bool) -> None:
    """optimizer_done(True) (one clock read for both) gives the marks optimizer_done() then mark_step() gave."""
    marks = {}
    for combined in (False, True):
        clock = StepClock()
        clock.times_optimizer = True
        clock.times_phases = phases
        marks[combined] = _steps(clock, combined)
    for two, one in zip(marks[False], marks[True], strict=True):
        assert one.batches == two.batches == 1 and one.loader_wait_s == two.loader_wait_s
        assert one.optimizer_s is not None and one.optimizer_s >= 0.002
        assert (one.duration_s is None) == (two.duration_s is None)
        assert (one.ready_s is None) == (two.ready_s is None)
        assert (one.forward_s is None) == (two.forward_s is None)
    assert marks[True][0].duration_s is None and all(m.duration_s > 0.002 for m in marks[True][1:])
    assert all(m.ready_s is not None and 0 < m.ready_s < m.duration_s - 0.002 for m in marks[True][1:])


def test_an_inner_optimizers_post_hook_marks_the_step_and_the_outer_one_keeps_timing() -> None:
    clock = StepClock()
    clock.times_optimizer = True
    clock.optimizer_started()  # the wrapper
    clock.optimizer_started()  # its inner optimizer
    clock.optimizer_done(True)  # the inner one is the one the hooks saw first: it marks
    clock.optimizer_done()
    clock.optimizer_done(True)  # a post-hook with no pre-hook seen (watched mid-step): still a mark
    assert len(clock.drain()) == 2
    assert clock._optimizer_depth == 0


def test_a_failing_cuda_event_in_the_combined_mark_is_swallowed() -> None:
    clock = StepClock()

    class Failing:
        def record_step(self) -> None:
            raise RuntimeError("CUDA error")

    clock.gpu_steps = Failing()
    clock.optimizer_started()
    clock.optimizer_done(True)
    assert clock.errors == 1 and clock.gpu_steps is None and len(clock.drain()) == 1


def test_the_hooks_do_nothing_in_a_forked_child() -> None:
    """The at-fork flag stands for the pid check the hooks made per call: a DataLoader worker marks no step."""
    reporter = Reporter(Address(port=1), window_s=0.5)  # not started: nothing connects
    try:
        reporter._on_optimizer_start(object(), (object(),), {})
        reporter._on_optimizer_step(object(), (object(),), {})
        assert len(reporter.clock.marks) == 1 and not reporter._forked
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report what its hooks did, and leave without running any cleanup
            reporter._on_optimizer_start(object(), (object(),), {})
            reporter._on_optimizer_step(object(), (object(),), {})
            os.write(write, f"{reporter._forked} {len(reporter.clock.marks)}".encode())
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        assert os.read(read, 100).decode() == "True 1"
        os.close(read)
    finally:
        reporter.thread.sender.close()


def test_tracking_the_same_loader_each_epoch_does_not_rebuild_the_hello() -> None:
    class Loader:
        batch_size, num_workers, pin_memory = 8, 0, False

    reporter = Reporter(Address(port=1), window_s=0.5)
    try:
        reporter.attach_loader(Loader())
        assert reporter.side.facts_changed.is_set()
        reporter.side.facts_changed.clear()
        reporter.attach_loader(Loader())  # the next epoch
        assert not reporter.side.facts_changed.is_set()
        Loader.batch_size = 16
        reporter.attach_loader(Loader())
        assert reporter.side.facts_changed.is_set() and reporter.side.facts["loader_batch_size"] == 16
    finally:
        reporter.thread.sender.close()


def test_ticks_come_with_the_windows_while_connected_with_nothing_to_send() -> None:
    reporter = Reporter(Address(port=1), window_s=0.5)
    try:

        class Sender:
            connected, idle = True, True

        reporter.thread.sender.close()
        real = reporter.thread.sender
        reporter.thread.sender = Sender()  # type: ignore[assignment]
        assert reporter.thread._next_tick_s(10.0, 10.0, 10.4) == 10.4  # the window's tick only
        Sender.idle = False  # bytes left to flush: a tick a TICK_S
        assert reporter.thread._next_tick_s(10.0, 10.0, 10.4) == 10.25
        Sender.connected, Sender.idle = False, True  # a connection to make
        assert reporter.thread._next_tick_s(10.0, 9.9, 10.4) == 10.25
        assert reporter.thread._next_tick_s(10.0, 9.9, 10.1) == 10.1  # never past the window
    finally:
        reporter.thread.sender = real


@pytest.mark.skipif(not LINUX_PROC, reason="/proc/<pid>/task/<tid>/children (Linux) is what the fast path reads")
def test_the_process_probe_from_proc_agrees_with_psutil() -> None:
    """Same fields, same figures within the two reads' timing: CPU, RSS, threads, a busy child and its CPU."""
    fast, slow = ProcessProbe(threading.get_native_id()), ProcessProbe(threading.get_native_id(), fast=False)
    assert fast._fast and not slow._fast
    child = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"])
    try:
        time.sleep(0.3)
        fast.read([]), slow.read([])
        time.sleep(0.6)
        a, b = fast.read([]), slow.read([])
    finally:
        child.kill()
        child.wait()
    assert a.keys() == b.keys(), a.keys() ^ b.keys()
    assert a["workers"] == b["workers"] == 1 and a["threads"] == b["threads"]
    assert abs(a["rss_bytes"] - b["rss_bytes"]) < 4 << 20
    assert abs(a["workers_cpu_pct"] - b["workers_cpu_pct"]) < 25, (a, b)  # a busy child, as busy as the cores let it
    assert a["workers_cpu_pct"] > 0


@pytest.mark.skipif(not LINUX_PROC, reason="/proc/<pid>/task/<tid>/children (Linux)")
def test_a_child_of_another_thread_is_found_and_kept_between_full_looks(monkeypatch) -> None:
    """Children of the training thread are read each window; another thread's, found by the full look, too."""
    probe = ProcessProbe(threading.get_native_id())
    started: list[subprocess.Popen[bytes]] = []
    sleeper = [sys.executable, "-c", "import time; time.sleep(5)"]
    done = threading.Event()

    def spawn() -> None:  # and live on: a thread's children go to another thread of the process when it ends
        started.append(subprocess.Popen(sleeper))
        done.wait(10)

    spawner = threading.Thread(target=spawn)
    probe.read([])  # the first read looks at every thread
    spawner.start()
    while not started:
        time.sleep(0.01)
    try:
        counts = [probe.read([])["workers"] for _ in range(process.FULL_SCAN_EVERY + 2)]
    finally:
        started[0].kill()
        started[0].wait()
        done.set()
        spawner.join()
    # Not seen until the next full look (its thread had no child then), and from then on every window.
    full = process.FULL_SCAN_EVERY - 1
    assert counts[:full] == [0] * full and counts[full:] == [1] * (len(counts) - full), counts


@pytest.mark.skipif(not LINUX_PROC, reason="/proc (Linux)")
def test_the_comm_threads_schedstat_is_not_read_once_they_are_named(monkeypatch) -> None:
    probe = ProcessProbe(threading.get_native_id())
    probe.read([])
    me = threading.get_native_id()
    probe._comm_threads[me] = True  # as if the training thread were gloo's: its wait no longer counts
    reads: list[str] = []
    real = process._read
    monkeypatch.setattr(process, "_read", lambda path: (reads.append(path), real(path))[1])
    out = probe.read([])
    assert not any(path.endswith(f"/{me}/schedstat") for path in reads), reads
    assert "main_cpu_wait_s" not in out and probe._comm_threads[me] is True
