"""The run chart: bars one line tall on a short screen, taller with room; each part drawn again only when it changed."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult

from gputop.model.samples import GpuSample
from gputop.model.snapshot import RunHistory
from gputop.tui.widgets import run_chart
from gputop.tui.widgets.run_chart import RunChart, spark, spark_rows
from tests.support import tui_fixtures as fx


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


class ChartApp(App[None]):
    def compose(self) -> ComposeResult:
        yield RunChart()


async def test_a_gpu_sample_draws_the_gpu_lines_again_and_a_new_second_the_bars(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A sample a second from the GPU sampler and a second of the run's history arrive apart:
    # each redraws its own part of the chart, not the other's.
    drawn: list[str] = []
    monkeypatch.setattr(run_chart, "spark_rows", lambda *a, **k: drawn.append("bars") or spark_rows(*a, **k))
    monkeypatch.setattr(run_chart, "spark", lambda *a, **k: drawn.append("gpu") or spark(*a, **k))

    def history(seconds: int) -> RunHistory:
        return RunHistory(0.0, (0.1,) * seconds, (640.0,) * seconds)

    def gpus(seconds: int) -> tuple[GpuSample, ...]:
        return tuple(GpuSample(t=t, gpus=(fx.gpu_reading(0, util=50.0 + t % 7, mem_gib=30.0),)) for t in range(seconds))

    async with ChartApp().run_test(size=(120, 40)) as pilot:
        chart = pilot.app.query_one(RunChart)
        chart.show(history=history(60), gpu_history=gpus(60), show_gpus=True)
        await pilot.pause()
        assert "GPU 0 util" in chart.text and "step mean" in chart.text
        drawn.clear()
        chart.show(history=history(60), gpu_history=gpus(61), show_gpus=True)
        assert drawn == ["gpu", "gpu"], f"a GPU sample drew {drawn}"  # utilization and memory
        drawn.clear()
        chart.show(history=history(61), gpu_history=gpus(61), show_gpus=True)
        assert drawn == ["bars", "bars"], f"a new second drew {drawn}"  # step time and samples/s


def test_the_axis_spans_the_data_so_a_ten_percent_swing_fills_the_chart() -> None:
    """Step times of 100-110 ms: from zero they are eight rows of solid blocks; on their own range they are not."""
    from gputop.tui.widgets.run_chart import axis

    values = [0.100, 0.105, 0.110, 0.100, 0.102]
    low, high = axis(values)
    assert high == 0.110 and 0.08 < low < 0.1
    lines = spark_rows(values, 5, 8, low=low, high=high)
    columns = ["".join(line[i] for line in lines) for i in range(5)]
    heights = [len(c.strip()) for c in columns]
    assert max(heights) - min(heights) >= 4, columns  # the swing takes half the chart's height or more
    assert axis([0.5, 0.5]) == (0.5 * (1 - 0.04), 0.5)  # a flat series: a sliver of range, not a division by zero
    assert axis([]) == (0.0, 0.0)
