"""Profiler capture's pure parts: the bounded request on the command channel, and the ranks side by side."""

from __future__ import annotations

import pytest

from gputop.model.captures import compare
from gputop.protocol import CaptureRequest, CaptureResult, OpTime, ProtocolError, decode_command, encode


def test_the_command_channel_takes_only_a_bounded_capture_request() -> None:
    request = CaptureRequest(rank=1, id="a-1", steps=5)
    assert decode_command(encode(request)) == request
    for bad in (
        b'{"type":"exec","rank":0,"id":"x","code":"import os"}',  # no other command exists
        b'{"type":"capture","rank":0,"id":"x","steps":0}',
        b'{"type":"capture","rank":0,"id":"x","steps":100000}',
        b'{"type":"capture","rank":0,"id":"../etc/passwd"}',  # ids name trace files: no paths
        b'{"type":"hello","run_id":"r","rank":0}',
    ):
        with pytest.raises(ProtocolError):
            decode_command(bad)


def test_side_by_side_is_per_step_and_missing_operators_read_na() -> None:
    r0 = CaptureResult(run_id="r", rank=0, id="a", t=0, ok=True, steps=5,
                       top_ops=(OpTime(name="aten::mm", calls=10, self_cpu_s=0.05),
                                OpTime(name="c10d::allreduce_", calls=5, self_cpu_s=0.5)))  # fmt: skip
    r1 = CaptureResult(run_id="r", rank=1, id="b", t=0, ok=True, steps=10,
                       top_ops=(OpTime(name="aten::mm", calls=20, self_cpu_s=0.1),))  # fmt: skip
    failed = CaptureResult(run_id="r", rank=2, id="c", t=0, ok=False, error="no step")
    header, rows = compare([r1, failed, r0])
    assert header == ["operator", "r0 CPU ms/step", "r1 CPU ms/step"]
    assert rows == [["c10d::allreduce_", "100.00", "N/A"], ["aten::mm", "10.00", "10.00"]]


def test_the_profiler_starts_and_stops_with_the_models_gpu_current(monkeypatch) -> None:
    """torch.profiler synchronises the current device at its stop: in a script that placed its model without
    ``set_device`` that is GPU 0, where it would make a CUDA context on another rank's GPU."""
    torch = pytest.importorskip("torch")
    from gputop.protocol.commands import CaptureRequest
    from gputop.reporter.capture import ProfilerCapture

    current: list[int] = [0]
    seen: list[tuple[str, int]] = []

    class Device:
        def __init__(self, index: int) -> None:
            self.index, self.before = index, 0

        def __enter__(self) -> None:
            self.before, current[0] = current[0], self.index

        def __exit__(self, *exc: object) -> None:
            current[0] = self.before

    class Profile:
        def __init__(self, **kwargs: object) -> None:
            pass

        def start(self) -> None:
            seen.append(("start", current[0]))

        def stop(self) -> None:
            seen.append(("stop", current[0]))

    monkeypatch.setattr(torch.cuda, "device", Device)
    monkeypatch.setattr(torch.profiler, "profile", Profile)
    capture = ProfilerCapture(CaptureRequest(rank=0, id="c1", steps=1), run_id="r", rank=0, device="cuda:3")
    capture.on_step()
    capture.on_step()
    assert seen == [("start", 3), ("stop", 3)] and current[0] == 0, (seen, capture.error)
