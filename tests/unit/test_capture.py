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
