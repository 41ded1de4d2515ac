"""The parts the training thread sets up and keeps current, and the reporter thread reads: one object both hold.

``Reporter`` (``reporter.py``) makes one and hands it to its ``ReporterThread`` (``reporter_thread.py``) and
to the parts that pick a model's probes (``model_probes.py``).  The training thread writes it: the facts it
learned (the hello is built from a copy), the probes a watched model offers, its forward count, the work each
step did; the reporter thread reads them once a window.  What is replaced is replaced whole (the probes' tuple,
the counter), never changed in place; the containers are appended to and updated under the GIL.  One thing
goes the other way: a profile capture the dashboard asked for, set by the reporter thread and driven by the
training thread's step marks.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from gputop.reporter.capture import ProfilerCapture
from gputop.reporter.clock import MAX_PENDING_STEPS, StepClock
from gputop.reporter.collectives import CollectiveTap
from gputop.reporter.ending import Ending
from gputop.reporter.flops import FlopCounter
from gputop.reporter.probes import Probe
from gputop.reporter.probes.compile import CompileProbe
from gputop.reporter.rank_cuda import RankCuda


class TrainingSide:
    """What one process's training thread shares with its reporter thread."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.clock = StepClock()  # the training thread's step marks, drained once a window
        self.pid = os.getpid()
        self.started_t = time.time()
        self.facts: dict[str, Any] = {}  # what the hello says; the reporter thread adds what it learns too
        self.facts_changed = threading.Event()
        # Replaced whole, never mutated.  torch.compile's from the start: it reads nothing until the script has
        # compiled something, model watched or not.
        self.probes: tuple[Probe, ...] = (CompileProbe(),)
        self.train_tid = threading.get_native_id()  # the thread that calls gputop: the training thread
        self.train_ident = threading.get_ident()  # the same thread, as sys._current_frames() names it
        self.grad_enabled: Callable[[], bool] | None = None  # torch.is_grad_enabled, once a model is watched
        self.train_forwards = 0  # forwards with autograd on: micro-batches, counted on the training thread
        # Every CUDA device a watched model was on, kept until the reporter thread drops their events at exit.
        self.cuda_devices: dict[int, RankCuda] = {}
        # The collectives torch.distributed's Python API issues, timed once a model is watched in a process group
        # and while a collector listens (``on``, set by the reporter thread).
        self.tap = CollectiveTap(self.clock)
        # The work each step does (issue #46): the counter, once a model is watched, and each step's (FLOPs or
        # None, ran under counting), appended at its step mark just before the mark itself: a window's marks are
        # paired with as many of these, oldest first.
        self.flops: FlopCounter | None = None
        self.step_work: deque[tuple[int | None, bool]] = deque(maxlen=MAX_PENDING_STEPS)
        self.ending = Ending()  # what ended the process, for the bye (installed by Reporter.start)
        # Set by the reporter thread when the dashboard asks for a profile; the training thread's step marks drive it.
        self.capture: ProfilerCapture | None = None
