"""The stack sampler on real threads: what each sample finds, how it tallies, what it costs and when it sends.

Every thread here is a real one blocked in a real place (a lock in this file,
a tracked loader); the sampler reads it from another thread with
``sys._current_frames()``, as the reporter thread does.  Threads blocked in
torch (its optimizer, autograd, a DataLoader, a gloo barrier) and a reporter
sending to a collector are in tests/integration/test_stack_sampler.py.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gputop.address import Address
from gputop.protocol import StackFrame
from gputop.reporter import stacks
from gputop.reporter.clock import StepClock, TrackedLoader
from gputop.reporter.sender import Sender
from gputop.reporter.stacks import StackSampler
from tests.support.sampling import blocked, sampled

THIS_FILE = "tests/unit/test_stack_sampler.py"  # as the sampler shows it: relative to the working folder (the repo)


def line_of(text: str) -> int:
    """The line of this file holding ``text`` (where a thread below blocks)."""
    return next(n for n, line in enumerate(Path(__file__).read_text().splitlines(), 1) if text in line)


def wait_for_lock(release: threading.Event) -> None:
    release.wait()  # the place every sample below must name


def deep(depth: int, then: Callable[[threading.Event], None]) -> Callable[[threading.Event], None]:
    """``then`` called ``depth`` frames deep (a realistic training stack is 30-50 frames)."""

    def call(release: threading.Event, left: int = depth) -> None:
        if left == 0:
            then(release)
        else:
            call(release, left - 1)

    return call


class TestWhatASampleFinds:
    def test_a_thread_blocked_on_a_lock_in_the_users_code_is_named_with_its_line(self) -> None:
        with blocked(deep(40, wait_for_lock)) as thread:
            message = sampled(thread)
        line = line_of("release.wait()  # the place")
        assert message.now == StackFrame("outside", THIS_FILE, line, "wait_for_lock")
        assert message.samples == 5
        assert [(f.where, f.file, f.line, f.function, f.count) for f in message.top] == [
            ("outside", THIS_FILE, line, "wait_for_lock", 5)
        ]

    def test_the_step_clock_tells_after_the_optimizer_step_from_before_it(self) -> None:
        clock = StepClock()
        with blocked(wait_for_lock) as thread:
            assert sampled(thread, clock=clock).now.where == "outside"  # type: ignore[union-attr]  # nothing seen
            clock.forwards += 1
            clock.mark_step()
            assert sampled(thread, clock=clock).now.where == "after_step"  # type: ignore[union-attr]
            clock.forwards += 1
            assert sampled(thread, clock=clock).now.where == "before_step"  # type: ignore[union-attr]

    def test_a_wait_in_a_tracked_loader_is_the_loader_with_the_users_generator(self) -> None:
        def slow_batches(release: threading.Event) -> Iterator[int]:
            yield 1
            release.wait()  # fetching the second batch
            yield 2

        def loop(release: threading.Event) -> None:
            for _ in TrackedLoader(slow_batches(release), StepClock()):
                pass

        with blocked(loop) as thread:
            now = sampled(thread).now
        assert now == StackFrame("loader", THIS_FILE, line_of("release.wait()  # fetching"), "slow_batches")

    def test_a_thread_with_no_frame_of_the_users_code_names_no_place(self) -> None:
        with blocked(lambda release: release.wait()) as thread:
            now = sampled(thread).now
        # The lambda is in this file: the user's.  threading's own frames are not.
        assert now is not None and now.file == THIS_FILE
        event = threading.Event()
        stdlib_only = threading.Thread(target=event.wait, daemon=True)
        stdlib_only.start()
        time.sleep(0.1)
        try:
            assert sampled(stdlib_only).now == StackFrame("outside", "", 0, "")
        finally:
            event.set()

    def test_a_thread_that_ended_has_no_now(self) -> None:
        thread = threading.Thread(target=lambda: None)
        thread.start()
        thread.join()
        message = sampled(thread)
        assert message.now is None and message.samples == 0 and message.top == ()


class TestTallies:
    def test_the_top_places_are_the_most_sampled_functions_and_now_is_the_newest_line(self) -> None:
        first, second, third = threading.Event(), threading.Event(), threading.Event()

        def save_checkpoint() -> None:
            third.wait()  # place three

        def two_lines(release: threading.Event) -> None:
            first.wait()  # place one
            second.wait()  # place two
            save_checkpoint()

        with blocked(two_lines) as thread:
            sampler = StackSampler(thread.ident or 0)
            for release, samples in ((first, 4), (second, 2), (None, 5)):
                for _ in range(samples):
                    sampler.sample()
                if release is not None:
                    release.set()
                    time.sleep(0.1)
            message = sampler.take("run", 2, time.time())
            third.set()
        assert message.rank == 2 and message.samples == 11
        # One function is one place, under its most-sampled line: its time is not split line by line.
        assert [(f.function, f.line, f.count) for f in message.top] == [
            ("two_lines", line_of("# place one"), 6),
            ("save_checkpoint", line_of("# place three"), 5),
        ]
        assert message.now is not None and message.now.line == line_of("# place three")
        empty = sampler.take("run", 2, time.time())
        assert empty.samples == 0 and empty.top == ()  # each message counts since the last

    def test_a_sample_that_costs_more_than_the_budget_lowers_the_rate(self, monkeypatch: pytest.MonkeyPatch) -> None:
        with blocked(deep(40, wait_for_lock)) as thread:
            sampler = StackSampler(thread.ident or 0, hz=20)
            for k in range(20):
                sampler.sample_when_due(float(k))
            sampler.take("run", 0, time.time())
            assert sampler.interval_s == pytest.approx(0.05)  # microseconds a sample: well within 0.1% at 20/s
            assert sampler.cost_s is not None and sampler.cost_s < 50e-6
            monkeypatch.setattr(stacks, "BUDGET_FRAC", 1e-9)  # a budget no sample fits in
            for k in range(20, 40):
                sampler.sample_when_due(float(k) * 1e6)
            sampler.take("run", 0, time.time())
        assert sampler.interval_s == pytest.approx(sampler.cost_s / 1e-9)

    def test_samples_see_each_part_of_a_step_in_proportion_even_when_the_step_divides_the_interval(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # A 62.5-ms step whose last 20% is a metric, sampled at an interval of exactly 2.5 steps (binary
        # fractions on a 1/1024-s clock, so no rounding drifts the phase): at a fixed interval every sample
        # falls at the step's start or middle, and the metric, a fifth of the step, is never seen.
        step_s, metric_from, tick_s = 0.0625, 0.8, 1 / 1024
        now = [0.0]
        seen: list[bool] = []
        sampler = StackSampler(threading.get_ident(), hz=1 / (2.5 * step_s))
        monkeypatch.setattr(sampler, "sample", lambda: seen.append((now[0] / step_s) % 1.0 >= metric_from))
        for tick in range(600 * 1024):  # 10 minutes: about 3,800 samples
            now[0] = tick * tick_s
            sampler.sample_when_due(now[0], cpu_before_wake_s=0.0)
        # On the 1/1024-s clock the metric holds 12 of the step's 64 ticks (those from 51.2 on), 18.75%, not 20%.
        truth = sum((t * tick_s / step_s) % 1.0 >= metric_from for t in range(64)) / 64
        share = sum(seen) / len(seen)
        # Jittered intervals: the share's spread over runs is 0.8 points (12 seeds); 4 points is 5 of it.
        assert abs(share - truth) < 0.04, f"metric share in samples {share:.3f} over {len(seen)} samples, true {truth}"
        assert len(seen) == pytest.approx(600 / (2.5 * step_s), rel=0.05)  # the mean rate, and its cost, kept

    @pytest.mark.parametrize(
        ("env", "hz", "complaint"),
        [
            ({}, 20.0, ""),
            ({"GPUTOP_STACKS": "0"}, None, ""),
            ({"GPUTOP_STACKS": "off", "GPUTOP_STACKS_HZ": "50"}, None, ""),
            ({"GPUTOP_STACKS_HZ": "50"}, 50.0, ""),
            ({"GPUTOP_STACKS_HZ": "fast"}, 20.0, "GPUTOP_STACKS_HZ='fast'"),
            ({"GPUTOP_STACKS_HZ": "1e6"}, 20.0, "0.5-200 samples a second"),
        ],
    )
    def test_the_settings(self, env: dict[str, str], hz: float | None, complaint: str) -> None:
        got, why = stacks.configured_hz(env)
        assert got == hz and complaint in why and bool(why) == bool(complaint)


class TestSending:
    def test_a_frame_for_this_connection_is_not_sent_after_a_reconnect(self, tmp_path: Path) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(tmp_path / "collector.sock"))
        listener.listen()
        listener.settimeout(10)
        sender = Sender(Address(path=tmp_path / "collector.sock"), backlog_frames=10)
        sender.enqueue(b"kept\n")
        sender.enqueue(b"dropped now: not connected\n", this_connection_only=True)
        sender.pump()
        first, _ = listener.accept()
        sender.enqueue(b"for this connection\n", this_connection_only=True)
        first.close()  # before the sender could write it: it would go again on the next connection
        sender.close()
        sender._next_attempt_s = 0.0
        sender.pump()
        second, _ = listener.accept()
        second.settimeout(2)
        sender.enqueue(b"window\n")
        sender.pump()
        received = b""
        while not received.endswith(b"window\n"):
            received += second.recv(4096)
        assert b"this connection" not in received and b"dropped now" not in received
        second.close()
        listener.close()
