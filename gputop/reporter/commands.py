"""The dashboard's commands to a rank, served on the reporter thread: a profile capture, the run's findings for
the trainer's logger, and the message types the dashboard accepts (the stacks it reads).

A capture is started here and driven by the training thread's step marks (``TrainingSide.capture``); its
result goes back on the same connection once it has finished, or given up.  A command that cannot be decoded
is named once, as an error event, and otherwise ignored.
"""

from __future__ import annotations

import time

from gputop.protocol import (
    Accepts,
    CaptureRequest,
    CaptureResult,
    FindingsNotice,
    ProtocolError,
    decode_command,
    encode,
)
from gputop.reporter.announcer import Announcer
from gputop.reporter.capture import ProfilerCapture, torch_profiler_available
from gputop.reporter.sender import Sender
from gputop.reporter.stack_reporting import StackReporting
from gputop.reporter.trainer_figures import TrainerLog
from gputop.reporter.training_side import TrainingSide


class Commands:
    """Reads the commands the sender received, and answers them."""

    def __init__(
        self,
        sender: Sender,
        announcer: Announcer,
        side: TrainingSide,
        *,
        trainer_log: TrainerLog,
        stacks: StackReporting,
    ) -> None:
        self._sender = sender
        self._announcer = announcer
        self._side = side
        self._trainer_log = trainer_log
        self._stacks = stacks

    def serve(self, now_s: float) -> None:
        """Take the dashboard's commands (captures, findings, accepted types); send a finished capture's result."""
        for frame in self._sender.read_commands():
            try:
                command = decode_command(frame)
                if isinstance(command, FindingsNotice):
                    self._trainer_log.findings = command
                elif isinstance(command, Accepts):
                    self._stacks.on_accepts(command, now_s)
                else:
                    self._start_capture(command)
            except ProtocolError as exc:
                self._announcer.report_error("command", exc)  # a bad command is named once, and otherwise ignored
        capture = self._side.capture
        if capture is None:
            return
        capture.give_up_if_stale(now_s)
        if capture.finished:
            self._side.capture = None
            self._sender.enqueue(encode(capture.result()))

    def _start_capture(self, request: CaptureRequest) -> None:
        hello = self._announcer.hello()
        why = torch_profiler_available()
        if (request.run_id and request.run_id != hello.run_id) or request.rank != hello.rank:
            why = f"this connection speaks for {hello.run_id} rank {hello.rank}"
        elif self._side.capture is not None:
            why = f"capture {self._side.capture.request.id} is still running on this rank"
        if why:
            refusal = CaptureResult(run_id=hello.run_id, rank=hello.rank, id=request.id, t=time.time(), ok=False,
                                    error=why)  # fmt: skip
            self._sender.enqueue(encode(refusal))
            return
        device = self._side.facts.get("device")
        self._side.capture = ProfilerCapture(request, run_id=hello.run_id, rank=hello.rank, device=device)
