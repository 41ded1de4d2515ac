"""The run chart's bars: one line where the screen is short, taller where it has room."""

from __future__ import annotations

from gputop.tui.widgets.run_chart import spark, spark_rows


def test_one_line_is_the_sparkline() -> None:
    values = [0.1, 0.2, None, 0.4]
    assert spark_rows(values, 6, 1) == [spark(values, 6, low=0.0)]


def test_taller_bars_fill_from_the_bottom_in_eighths_of_a_line() -> None:
    # 4 lines = 32 eighths: the peak fills all of them, half of it 16 (the bottom two lines).
    lines = spark_rows([1.0, 0.5, None, 0.25], 5, 4)
    columns = ["".join(line[i] for line in lines) for i in range(5)]
    assert columns[0] == "    "  # fewer values than columns: blank on the left
    assert columns[1] == "████"  # the peak: the whole height
    assert columns[2] == "  ██"  # half: the bottom two lines, top first
    assert columns[3] == "    "  # not measured: a gap, never a zero
    assert columns[4] == "   █"  # a quarter: one full line


def test_a_small_value_still_shows_and_a_fixed_scale_is_kept() -> None:
    lines = spark_rows([0.001, 50.0], 2, 2, high=100.0)
    columns = ["".join(line[i] for line in lines) for i in range(2)]
    assert columns[0] == " ▁"  # a sliver, not nothing: 0.001 was measured
    assert columns[1] == " █"  # 50 of 100 on 2 lines: the bottom line full
