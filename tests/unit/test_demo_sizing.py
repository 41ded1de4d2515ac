"""The demo sizes itself to the machine, and says what it runs where."""

from __future__ import annotations

import pytest

from gputop.demos.scenarios import SCENARIOS, fitted, plan


@pytest.mark.parametrize("cores", [1, 2, 4, 16, 64])
def test_the_oversubscribed_demo_oversubscribes_any_machine(cores: int) -> None:
    # 4 threads a rank was enough on 2 cores; on 64 it would leave 56 idle and show nothing wrong.
    threads = fitted(SCENARIOS["oversubscribed"], cores=cores, nproc=2).torch_threads
    assert 2 * threads >= 2 * cores, f"{cores} cores: 2 ranks x {threads} threads"


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n != "oversubscribed"])
def test_the_other_demos_keep_a_thread_a_rank_whatever_the_cores(name: str) -> None:
    for cores in (1, 2, 64):
        assert fitted(SCENARIOS[name], cores=cores, nproc=2) == SCENARIOS[name]


def test_the_plan_says_when_the_cores_are_shared_or_too_few() -> None:
    assert plan("healthy", cores=2, nproc=2) == (
        "demo 'healthy': 2 ranks x 1 compute thread on 2 CPUs, shared with gloo's threads and gputop"
    )
    assert plan("healthy", cores=8, nproc=2) == "demo 'healthy': 2 ranks x 1 compute thread on 8 CPUs"
    assert "more compute threads than CPUs" in plan("healthy", cores=1, nproc=2)
    assert plan("oversubscribed", cores=16, nproc=2) == "demo 'oversubscribed': 2 ranks x 16 compute threads on 16 CPUs"
