"""The hang rule on windows made to measure: its line follows the job's own steps."""

from __future__ import annotations

import pytest

from gputop.collect.store import Store
from gputop.diagnose import diagnose
from gputop.diagnose.findings import Finding
from gputop.model.figures import SPAN_S, summarize
from gputop.model.snapshot import SPAN_COPY_WINDOWS
from gputop.protocol import Bye, Hello, Window

T0 = 1_000_000.0


def hangs(stepping_s: float, idle_s: float, *, step_s: float = 0.05, longest_s: float | None = None,
          idle_cpu_pct: float = 2.0, history: int | None = None, window_s: float = 0.5,
          long_step_at_s: float | None = None) -> list[Finding]:  # fmt: skip
    """Hang findings, live, for 2 ranks stepping every ``step_s`` for ``stepping_s`` and then not for ``idle_s``.

    Their reporters keep sending (empty) windows meanwhile, as a hung rank's do.  ``history``: the newest
    windows a view copies of each rank (a live view's ``SPAN_COPY_WINDOWS``; None, a recording's all).
    ``long_step_at_s``: ``longest_s`` is one step then (seconds from the start), not every step.
    """
    store = Store()
    for rank in (0, 1):
        store.ingest(Hello(run_id="job", rank=rank, world_size=2, pid=100 + rank), T0)
    t, seq, total = T0, 0, 0
    while t < T0 + stepping_s + idle_s:
        stepping = t < T0 + stepping_s
        steps = int(window_s / step_s) if stepping else 0
        long_here = long_step_at_s is None or t <= T0 + long_step_at_s < t + window_s
        total += steps
        seq += 1
        for rank in (0, 1):
            window = Window(
                run_id="job", rank=rank, seq=seq, t0=t, t1=t + window_s, steps=steps, step_total=total,
                step_time_sum_s=steps * step_s, step_time_p50_s=step_s if steps else None,
                step_time_max_s=(longest_s if longest_s and long_here else step_s) if steps else None,
                cpu_pct=95.0 if stepping else idle_cpu_pct,
            )  # fmt: skip
            store.ingest(window, t + window_s)
        t += window_s
    return [f for f in diagnose(summarize(store.snapshot(t, history=history), span_s=SPAN_S)) if f.cause == "hang"]


def test_ranks_blocked_past_the_line_are_hung() -> None:
    (hang,) = hangs(20.0, 8.0)
    assert hang.severity == "critical" and hang.ranks == (0, 1)
    assert "not finished a step for 8 s" in hang.title and "hung" in hang.title


@pytest.mark.parametrize("history", [SPAN_COPY_WINDOWS, None], ids=["live", "recording"])
def test_a_hang_longer_than_the_windows_a_view_reaches_back_is_still_a_hang(history: int | None) -> None:
    """Ten minutes without a step: the live view copies each rank's newest 40 windows (20 s here), and the
    rule read its usual step from 4 minutes of windows; neither may lose the last step, or the hang clears."""
    (hang,) = hangs(20.0, 600.0, history=history)
    assert "not finished a step for 600 s" in hang.title, hang.title


def test_a_pause_shorter_than_the_floor_is_not_a_hang() -> None:
    assert hangs(20.0, 3.0) == []


def test_a_job_whose_long_steps_take_longer_is_given_longer() -> None:
    """A job that saves for 4 s now and then: 8 s without a step is within twice its longest step."""
    assert hangs(20.0, 7.0, longest_s=4.0) == []
    assert hangs(20.0, 9.0, longest_s=4.0) != []


def test_the_longest_step_is_read_over_minutes_whatever_the_window() -> None:
    """A 4-s save 100 s before the stop is within the lookback at 0.25-s windows as at 1-s ones (it was read
    over 240 windows: a minute at 0.25 s), so 7 s without a step is still within twice it."""
    for window_s in (0.25, 1.0):
        assert hangs(120.0, 7.0, longest_s=4.0, long_step_at_s=20.0, window_s=window_s) == [], window_s
        assert hangs(120.0, 9.0, longest_s=4.0, long_step_at_s=20.0, window_s=window_s) != [], window_s


def test_ranks_busy_on_the_cpu_meanwhile_are_a_warning_not_hung() -> None:
    """An evaluation pass that never marks a step burns CPU; a blocked rank does not."""
    (busy,) = hangs(20.0, 8.0, idle_cpu_pct=100.0)
    assert busy.severity == "warn" and "busy on the CPU" in busy.title


def test_stepping_again_clears_it() -> None:
    assert hangs(20.0, 0.5) == []


def ended_hung(byes: dict[int, Bye], now_s: float = 60) -> list[Finding]:
    """20 s of steps, 8 s of empty windows (hung), then each rank's bye; the hang findings ``now_s`` after T0."""
    store = Store()
    for rank in (0, 1):
        store.ingest(Hello(run_id="job", rank=rank, world_size=2, pid=100 + rank), T0)
    for seq in range(1, 57):
        t = T0 + (seq - 1) * 0.5
        steps = 10 if t < T0 + 20 else 0
        for rank in (0, 1):
            store.ingest(Window(run_id="job", rank=rank, seq=seq, t0=t, t1=t + 0.5, steps=steps,
                                step_total=10 * min(seq, 40), step_time_sum_s=steps * 0.05,
                                step_time_p50_s=0.05 if steps else None, step_time_max_s=0.05 if steps else None,
                                cpu_pct=1.0), t + 0.5)  # fmt: skip
    for bye in byes.values():
        store.ingest(bye, T0 + 28.1)
    return [f for f in diagnose(summarize(store.snapshot(T0 + now_s), span_s=None)) if f.cause == "hang"]


def test_a_hung_job_ended_by_sigterm_is_reported_hung_and_how_it_ended() -> None:
    """The scheduler's SIGTERM to a hung job: each rank's bye says so, and the report still names the hang."""
    byes = {r: Bye(run_id="job", rank=r, t=T0 + 28.1, step_total=400, how="signal", detail="SIGTERM") for r in (0, 1)}
    for now_s in (28.5, 60.0, 3600.0):  # at once, and the next morning
        (hang,) = ended_hung(byes, now_s)
        assert hang.severity == "critical" and hang.ranks == (0, 1), hang.title
        assert "not finished a step for 8 s" in hang.title and "then ended by SIGTERM" in hang.title, hang.title


WATCHDOG = (
    "DistBackendError: [PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=46, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600041 millis"
)
GLOO = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 8000ms for "
    "recv operation to complete"
)


def test_a_rank_the_backend_failed_in_a_collective_says_which_and_how_not_the_whole_message() -> None:
    """NCCL's watchdog names the collective by torch's number; gloo the wait that timed out."""
    byes = {0: Bye(run_id="job", rank=0, t=T0 + 28.1, step_total=400, how="exception", detail=WATCHDOG[:200]),
            1: Bye(run_id="job", rank=1, t=T0 + 28.1, step_total=400, how="exception", detail=GLOO[:200])}  # fmt: skip
    (hang,) = ended_hung(byes)
    assert hang.title.endswith(
        "; then rank 0 failed in all_reduce #46 (NCCL's watchdog timed out), rank 1 failed: gloo timed out after 8 s "
        "waiting to recv"
    ), hang.title


def test_a_job_that_stopped_stepping_and_then_exited_by_itself_is_not_called_hung() -> None:
    """A long final save or evaluation after the last step, then a clean exit: the job finished, no hang."""
    byes = {r: Bye(run_id="job", rank=r, t=T0 + 28.1, step_total=400, how="exit") for r in (0, 1)}
    assert ended_hung(byes) == []


def test_a_job_killed_while_hung_is_reported_hung() -> None:
    """The ranks go silent 8 s after their last step (the user killed the hung job): the report still says hang."""
    (hang,) = ended_hung({}, now_s=60)  # no bye: 32 s after the last window, both ranks lost
    assert hang.ranks == (0, 1) and "when they stopped reporting" in hang.title, hang.title
    assert "not finished a step for 8 s" in hang.title, hang.title
