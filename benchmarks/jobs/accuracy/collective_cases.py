"""Issue #55's desyncs the backend does not go on through: ranks at one collective number in different calls.

Each job is the convnet's DDP loop with a metric all-reduced after every step (a loss average, as scripts log
one); from ``HANG_STEP`` rank 1's call differs.  gloo then waits for good, so each job is ended as a scheduler
ends a hung one, by SIGTERM once the budget is spent (``unseen_cases._SigtermAt``).  Written, and their first
scores read, before any rule saw them run as corpus jobs (real-job tests had shown the rules the same shapes).
"""

from __future__ import annotations

import torch
from common import start
from unseen_cases import HANG_STEP, _SigtermAt, train_logging_a_metric


def _metric_unlike_on_rank1(seconds: float, *, size_on_rank1: int = 1, skip_on_rank1: bool = False) -> None:
    """The loss all-reduced after every step; from HANG_STEP rank 1 all-reduces ``size_on_rank1`` floats, or skips
    it for the barrier a script ends its logging with.  gloo waits for good; SIGTERM once the budget is spent."""
    rank = start()
    leave = _SigtermAt(seconds)

    def logged(step: int, loss: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        if step == HANG_STEP:
            leave.hang_begins()
        late = rank == 1 and step >= HANG_STEP
        if late and skip_on_rank1:
            return None  # rank 1 thinks logging is over
        return torch.full((size_on_rank1 if late else 1,), loss.item())

    train_logging_a_metric(logged, lambda step: False)


def desync_metric_size(seconds: float) -> None:
    """From step 10 rank 1 all-reduces its metric with a second value beside it (8 bytes against rank 0's 4)."""
    _metric_unlike_on_rank1(seconds, size_on_rank1=2)


def desync_barrier_meets_metric(seconds: float) -> None:
    """From step 10 rank 1 skips the metric's all-reduce and enters a barrier, which meets rank 0's all-reduce."""
    _metric_unlike_on_rank1(seconds, skip_on_rank1=True)
