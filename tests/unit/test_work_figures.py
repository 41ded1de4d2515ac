"""The work each step does, from the reporter's counted FLOPs to FLOP/s achieved and MFU (issue #46, docs/mfu.md)."""

from __future__ import annotations

import msgspec
import pytest

from gputop.collect.store import Store
from gputop.combine import merge_windows
from gputop.model.figures import RankFigures, summarize
from gputop.model.work import flops_text, work_entry, work_text
from gputop.reporter.clock import StepMark
from gputop.reporter.window import flops_fields
from tests.support import tui_fixtures as fx


def marks(*durations: float | None) -> list[StepMark]:
    return [StepMark(end_s=0.0, duration_s=d, loader_wait_s=0.0, batches=1) for d in durations]


def test_a_windows_flops_leave_out_the_counted_step_the_unknown_ones_and_the_untimed_first() -> None:
    """The step under the counting ran slower (the counter's toll on every operator): its time is no steady step's."""
    work = [(4_000_000, False), (4_000_000, True), (None, False), (4_000_000, False), (4_000_000, False)]
    fields = flops_fields(marks(None, 0.030, 0.010, 0.010, 0.012), work)
    assert fields == {"flops_sum": 8_000_000.0, "flops_time_s": pytest.approx(0.022), "flops_steps": 2}
    assert flops_fields(marks(0.01, 0.01), [(None, False), (5, True)]) == {}


def ranks_with_work(
    *, flops_per_step: float, cuda: bool, per_rank: dict[int, dict[str, object]] | None = None, **facts: object
) -> list[RankFigures]:
    """A 2-rank run whose every window says its steps did ``flops_per_step`` each (``per_rank``: a rank's own facts)."""
    store = Store(listen=fx.LISTEN)
    device = {"device": "cuda:0"} if cuda else {"device": "cpu", "device_name": None, "device_uuid": None}
    for rank in range(2):
        store.ingest(fx.hello("run-w", rank, 2, **{**device, **facts, **(per_rank or {}).get(rank, {})}), fx.T0)
    for seq in range(20):
        for rank in range(2):
            w = fx.window("run-w", rank, seq, step_s=0.100, loader_s=0.001, cuda=cuda)
            w = msgspec.structs.replace(
                w, flops_sum=flops_per_step * w.steps, flops_time_s=w.step_time_sum_s, flops_steps=w.steps
            )
            store.ingest(w, fx.T0 + (seq + 1) * fx.WINDOW_S)
    return list(summarize(store.snapshot(fx.T0 + 21 * fx.WINDOW_S), span_s=None).runs[0].ranks)


def test_a_cpu_rank_reads_its_mfu_against_the_peak_it_measured() -> None:
    rank = ranks_with_work(flops_per_step=2e9, cuda=False, cpu_peak_flops=200e9, cpu_peak_cost_s=0.15)[0]
    stats = rank.stats
    assert stats.work.flops_per_step == pytest.approx(2e9)
    step = stats.step.mean_s
    assert step is not None
    assert stats.work.achieved_flops_per_s == pytest.approx(2e9 / step, rel=1e-9)
    assert rank.mfu == pytest.approx(2e9 / step / 200e9, rel=1e-9)
    entry = work_entry(rank)
    assert entry["mfu_pct"] == pytest.approx(100 * 2e9 / step / 200e9, abs=1e-3)
    assert "an fp32 matmul on the rank's own threads, measuring it took 150 ms" in work_text(entry)


def test_ranks_on_one_host_read_mfu_against_the_best_peak_any_of_them_measured() -> None:
    """Rank 0 measured its peak while its neighbour loaded the cores (51 GFLOP/s), rank 1 not (170): the same
    work reads one MFU on both, against 170, and rank 0 says its own reading."""
    low, high = ranks_with_work(flops_per_step=2e9, cuda=False, cpu_peak_cost_s=0.15,
                                per_rank={0: {"cpu_peak_flops": 51e9}, 1: {"cpu_peak_flops": 170e9}})  # fmt: skip
    assert low.mfu == pytest.approx(high.mfu, rel=1e-6) and high.work_peak[0] == 170e9
    said = "the best of its host's ranks' fp32 matmuls on their own threads (its own read 51 GFLOP/s)"
    assert low.work_peak[1] == said
    assert high.work_peak[1].startswith("an fp32 matmul on the rank's own threads")
    # On another host, or with other thread counts, a rank keeps its own.
    apart = ranks_with_work(flops_per_step=2e9, cuda=False, per_rank={0: {"cpu_peak_flops": 51e9, "hostname": "b"},
                                                                      1: {"cpu_peak_flops": 170e9}})  # fmt: skip
    assert apart[0].work_peak[0] == 51e9


def test_a_gpu_ranks_mfu_is_against_its_datasheet_peak_for_the_dtypes_it_computed_in() -> None:
    """An H100 SXM computing in bf16: 989 TFLOP/s dense.  The same job without a count, or on a GPU the table does
    not know, is N/A with the reason, never a guess."""
    rank = ranks_with_work(flops_per_step=50e12, cuda=True, flops_mix={"bfloat16": 1.0}, flops_note="")[0]
    entry = work_entry(rank)
    peak = entry["peak_flops_per_s"]
    assert peak is not None and 980e12 <= peak <= 1000e12, entry
    assert entry["mfu_pct"] == pytest.approx(100 * entry["achieved_flops_per_s"] / peak, rel=1e-3)
    unknown = ranks_with_work(flops_per_step=50e12, cuda=True, flops_mix={"bfloat16": 1.0}, device_name="NVIDIA A10G")
    entry = work_entry(unknown[0])
    assert entry["mfu_pct"] is None and "no peak known" in (entry["work_note"] or ""), entry
    store = Store(listen=fx.LISTEN)
    store.ingest(fx.hello("run-n", 0, 1, flops_note="model not counted yet"), fx.T0)
    store.ingest(fx.window("run-n", 0, 0, step_s=0.1, loader_s=0.0), fx.T0 + 0.5)
    (uncounted,) = summarize(store.snapshot(fx.T0 + 1.0), span_s=None).runs[0].ranks
    assert work_text(work_entry(uncounted)) == "work a step: N/A (model not counted yet)"


def test_merged_windows_keep_the_work_and_its_time_together() -> None:
    ws = [
        msgspec.structs.replace(
            fx.window("r", 0, seq, step_s=0.1, loader_s=0.0), flops_sum=1e9, flops_time_s=0.4, flops_steps=4
        )
        for seq in range(3)
    ]
    ws.append(fx.window("r", 0, 3, step_s=0.1, loader_s=0.0))  # a window none of whose steps was counted
    merged = merge_windows(ws)
    assert (merged.flops_sum, merged.flops_steps) == (3e9, 12)
    assert merged.flops_time_s == pytest.approx(1.2)


def test_flops_read_as_a_person_reads_them() -> None:
    expected = ["512 FLOP", "3.4 MFLOP", "1.23 GFLOP", "4.5 TFLOP"]
    assert [flops_text(x) for x in (512, 3.4e6, 1.234e9, 4.5e12)] == expected
