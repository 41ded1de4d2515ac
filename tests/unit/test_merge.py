"""Merging a rank's windows keeps every figure: a field the merger forgets is a figure old recordings lose."""

from __future__ import annotations

import msgspec

from gputop.combine import COMBINE, OWN_RULE, merge_windows
from gputop.protocol import Window
from tests.support.windows import full_window


def test_every_field_a_window_carries_survives_a_merge() -> None:
    window = full_window(1)
    unset = [f for f in msgspec.structs.fields(Window) if getattr(window, f.name) in (None, {}, [])]
    assert unset == [], "full_window() must fill every field: a new one goes there too"
    merged = merge_windows([full_window(1), full_window(2)])
    lost = [f.name for f in msgspec.structs.fields(Window) if getattr(merged, f.name) in (None, {}, [])]
    assert lost == [], f"merge_windows drops {lost}"
    assert merged.step_sketch == {700: 10} and merged.forwards == 10 and merged.cpu_wait_s == 0.04


def test_every_field_has_one_rule() -> None:
    """A new Window field is declared in gputop.combine, once, or merge_windows refuses to guess."""
    names = {f.name for f in msgspec.structs.fields(Window)}
    assert set(COMBINE) | OWN_RULE == names and not set(COMBINE) & OWN_RULE
