"""A rank's window history: older windows kept encoded read back exactly, in less memory, within its length."""

from __future__ import annotations

import tracemalloc

import msgspec
import pytest

from gputop.collect import window_history
from gputop.collect.window_history import WindowHistory
from gputop.protocol import Window, decode, encode
from tests.support import tui_fixtures as fx
from tests.support.windows import full_window


def _received(seq: int) -> Window:
    """A window as the collector holds it: decoded from its frame."""
    message = decode(encode(full_window(seq)))
    assert isinstance(message, Window)
    return message


def test_older_windows_read_back_equal_to_the_ones_received() -> None:
    windows = [_received(seq) for seq in range(1, 11)]
    history = WindowHistory(None, objects=4)
    for w in windows:
        history.append(w)
    assert history.newest() == tuple(windows)  # every field, six of them through the encoding
    assert history.newest(3) == tuple(windows[-3:])
    assert history.newest(7) == tuple(windows[-7:])
    assert history.newest(0) == ()
    assert len(history) == 10


def test_the_oldest_windows_go_first_beyond_the_length() -> None:
    history = WindowHistory(5, objects=3)
    for seq in range(1, 9):
        history.append(_received(seq))
    assert [w.seq for w in history.newest()] == [4, 5, 6, 7, 8]
    history.shorten(2)
    assert [w.seq for w in history.newest()] == [7, 8]
    short = WindowHistory(2, objects=40)  # shorter than the part kept as objects
    for seq in range(1, 5):
        short.append(_received(seq))
    assert [w.seq for w in short.newest()] == [3, 4]


def test_a_ranks_share_at_1024_ranks_takes_well_under_its_objects_memory() -> None:
    """146 windows, each rank's share of the store at 1,024 ranks: measured 0.66 of their objects' bytes."""
    frames = [encode(fx.window("run", 3, seq, step_s=0.1, loader_s=0.01)) for seq in range(146)]
    tracemalloc.start()
    try:
        objects = [decode(frame) for frame in frames]
        as_objects = tracemalloc.get_traced_memory()[0]
        del objects
        history = WindowHistory(146)
        start = tracemalloc.get_traced_memory()[0]
        for frame in frames:
            window = decode(frame)
            assert isinstance(window, Window)
            history.append(window)
        kept = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert len(history) == 146
    assert kept < 0.75 * as_objects, (kept, as_objects)


def test_the_rank_on_screen_has_only_its_new_older_windows_decoded_on_each_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded: list[int] = []
    decoder = msgspec.msgpack.Decoder(Window)

    class CountingDecoder:
        def decode(self, blob: bytes) -> Window:
            window = decoder.decode(blob)
            decoded.append(window.seq)
            return window

    monkeypatch.setattr(window_history, "_DECODER", CountingDecoder())
    history = WindowHistory(None, objects=4)
    windows = [_received(seq) for seq in range(1, 31)]
    for w in windows[:20]:
        history.append(w)
    assert history.newest(12) == tuple(windows[8:20])  # 8 older windows decoded
    assert decoded == list(range(9, 17))
    decoded.clear()
    history.append(windows[20])  # window 17 ages into the encoded part
    assert history.newest(12) == tuple(windows[9:21])
    assert decoded == [17], "only the window new to the older part is decoded again"
    decoded.clear()
    assert history.newest(4) == tuple(windows[16 : 20 + 1])[-4:]  # another rank is on screen: nothing decoded...
    assert history.newest(12) == tuple(windows[9:21])
    assert decoded == list(range(10, 18)), "...and what was kept for this one let go"
