"""Framing and validation of the wire format."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gputop.protocol import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    Bye,
    Event,
    Hello,
    Message,
    ProtocolError,
    Window,
    decode,
    encode,
)
from gputop.sketch import legacy_hist_to_sketch, sketch_bucket, sketch_quantile_s, sketch_quantiles_s, sketch_value_s


def test_every_message_type_round_trips() -> None:
    messages: list[Message] = [
        Hello(run_id="r", rank=1, world_size=2, device="cuda:0", device_uuid="GPU-abc", loader_pin_memory=True),
        Window(run_id="r", rank=1, seq=3, t0=1.0, t1=1.5, steps=4, step_sketch={40: 4}, comm_s=0.01, overlap_s=0.002),
        Event(run_id="r", rank=1, t=2.0, kind="error", message="ddp_stats: KeyError"),
        Bye(run_id="r", rank=1, t=3.0, step_total=40, dropped=2),
    ]
    for message in messages:
        frame = encode(message)
        assert frame.endswith(b"\n") and frame.count(b"\n") == 1
        assert decode(frame) == message


def test_none_means_not_measured_and_is_left_off_the_wire() -> None:
    frame = encode(Window(run_id="r", rank=0, seq=1, t0=0.0, t1=0.5))
    obj = json.loads(frame)
    assert "comm_s" not in obj and "mem_peak_bytes" not in obj
    decoded = decode(frame)
    assert isinstance(decoded, Window) and decoded.comm_s is None


@pytest.mark.parametrize(
    ("frame", "complaint"),
    [
        (b"not json\n", "not JSON"),
        (b"[1, 2]\n", "JSON object"),
        (json.dumps({"v": 99, "type": "hello", "run_id": "r", "rank": 0}).encode(), "protocol version"),
        (json.dumps({"v": PROTOCOL_VERSION, "type": "pickle", "run_id": "r", "rank": 0}).encode(), "unknown"),
        (json.dumps({"v": PROTOCOL_VERSION, "type": "hello", "run_id": "r", "rank": "zero"}).encode(), "rank"),
        (json.dumps({"v": PROTOCOL_VERSION, "type": "hello", "rank": 0}).encode(), "run_id"),
        (
            json.dumps(
                {
                    "v": PROTOCOL_VERSION,
                    "type": "window",
                    "run_id": "r",
                    "rank": 0,
                    "seq": 1,
                    "t0": 0,
                    "t1": 1,
                    "steps": True,
                }
            ).encode(),
            "steps",
        ),
        (b'{"v":1,"type":"window","run_id":"r","rank":0,"seq":1,"t0":0,"t1":NaN}', "t1"),
        (
            b'{"v":1,"type":"window","run_id":"r","rank":0,"seq":1,"t0":0,"t1":1,"step_sketch":{"100000":1}}',
            "step_sketch",
        ),
        (b'{"v":1,"type":"window","run_id":"r","rank":0,"seq":1,"t0":0,"t1":1,"step_hist":{"101":1}}', "step_hist"),
        (b'{"v":1,"type":"window","run_id":"r","rank":0,"seq":1,"t0":0,"t1":1,"step_hist":{"1":1e400}}', "step_hist"),
        (b'{"v":1,"type":"window","run_id":"r","rank":0,"seq":1,"t0":0,"t1":1' + b"0" * 400 + b"}", "t1"),
        (b'{"v":1,"type":"hello","run_id":"r","rank":1' + b"0" * 30 + b"}", "rank"),
        (b'{"v":1,"type":"hello","run_id":"r","rank":-1}', "negative"),
        (b'{"v":1,"type":"window","run_id":"r","rank":0,"seq":1,"t0":5,"t1":1}', "backwards"),
        (b'{"v":1,"type":"window","run_id":"r","rank":0,"seq":1,"t0":0,"t1":1,"steps":-3}', "negative"),
    ],
)
def test_bad_frames_are_rejected_with_a_reason(frame: bytes, complaint: str) -> None:
    with pytest.raises(ProtocolError, match=complaint):
        decode(frame)


def test_oversized_frame_is_rejected_before_parsing() -> None:
    with pytest.raises(ProtocolError, match="exceeds"):
        decode(b"{" + b" " * MAX_FRAME_BYTES + b"}")


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    obj = json.loads(encode(Bye(run_id="r", rank=0, t=1.0)))
    obj["from_the_future"] = {"x": 1}
    assert decode(json.dumps(obj)) == Bye(run_id="r", rank=0, t=1.0)


@given(st.floats(min_value=1e-6, max_value=1e4))
def test_a_sketch_bucket_stands_for_its_durations_within_one_percent(seconds: float) -> None:
    value = sketch_quantile_s({sketch_bucket(seconds): 1}, 0.5)
    assert value is not None
    assert abs(value - seconds) / seconds <= 0.01 + 1e-9


@given(
    st.dictionaries(st.integers(0, 1200), st.integers(1, 50), min_size=1, max_size=30),
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4),
)
def test_a_sketchs_quantiles_are_the_nearest_rank_steps(sketch: dict[int, int], qs: list[float]) -> None:
    """Each quantile is the bucket of the step at rank min(int(q * n), n - 1), all taken in one walk."""
    steps = sorted(bucket for bucket, count in sketch.items() for _ in range(count))
    expected = tuple(sketch_value_s(steps[min(int(q * len(steps)), len(steps) - 1)]) for q in sorted(qs))
    assert sketch_quantiles_s(sketch, tuple(sorted(qs))) == expected
    assert sketch_quantile_s(sketch, qs[0]) == sketch_value_s(steps[min(int(qs[0] * len(steps)), len(steps) - 1)])


def test_a_first_protocol_histogram_still_reads_as_its_bucket_middles() -> None:
    # Bucket 40 of the old 4-per-octave histogram is 100 us * 2**(39.5/4) ~ 93 ms.
    value = sketch_quantile_s(legacy_hist_to_sketch({40: 3}), 0.5)
    assert value is not None and abs(value - 1e-4 * 2 ** (39.5 / 4)) / value < 0.01
    assert sketch_quantile_s({}, 0.5) is None
