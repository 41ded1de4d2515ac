"""GputopCallback marks Lightning's training forwards itself only where the watched model's hooks miss them."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning is not installed")


class StandInReporter:
    """Counts forwards as the reporter's hooks do, and records which of them the callback called."""

    def __init__(self) -> None:
        self.clock = SimpleNamespace(forwards=0)
        self.called: list[str] = []

    def _on_forward(self, module: Any, args: Any) -> None:
        self.clock.forwards += 1
        self.called.append("start")

    def _on_forward_done(self, module: Any, args: Any, output: Any) -> None:
        self.called.append("done")


def run_batches(monkeypatch: pytest.MonkeyPatch, *, hooks_see_forward: bool, batches: int = 3) -> StandInReporter:
    from gputop.integrations import lightning

    reporter = StandInReporter()
    monkeypatch.setattr(lightning, "_reporter", lambda: reporter)
    callback = lightning.GputopCallback(log_figures=False)
    for i in range(batches):
        callback.on_train_batch_start(None, None, None, i)
        if hooks_see_forward:  # the step ran through a module whose forward the reporter hooked
            reporter.clock.forwards += 1
        callback.on_before_backward(None, None, None)
    return reporter


def test_the_callback_marks_every_training_forward_when_the_hooks_see_none(monkeypatch: pytest.MonkeyPatch) -> None:
    reporter = run_batches(monkeypatch, hooks_see_forward=False)
    assert reporter.called == ["start", "done"] * 3 and reporter.clock.forwards == 3


def test_the_callback_leaves_the_forwards_to_the_hooks_when_they_see_them(monkeypatch: pytest.MonkeyPatch) -> None:
    reporter = run_batches(monkeypatch, hooks_see_forward=True)
    assert reporter.called == [] and reporter.clock.forwards == 3
