"""The recompile rule: a compiled job that recompiles again and again is named, with the function and the fix."""

from __future__ import annotations

import msgspec

from gputop.collect.store import Store
from gputop.diagnose import diagnose
from gputop.diagnose.rules.recompile import stall_beyond_compiles
from gputop.model.figures import summarize
from gputop.model.rank_stats import CompileFigures, RankStats, StallFigures, StepTimes
from gputop.protocol import Event, Hello
from tests.support.diagnose_fixtures import T0, RankSpec, rank_windows

REASON = "recompiled 'forward' (train.py:31): 0/2: tensor 'x' size mismatch at index 1. expected 24, actual 40"


def compiled_run(*, compile_windows: dict[int, tuple[int, int, float]], stall_s: float = 0.0) -> Store:
    """Two ranks, 10 s of 0.1-s steps; window n holds (compiles, recompiles, compile seconds) from the dict."""
    store = Store()
    for rank in (0, 1):
        hello = Hello(run_id="run", rank=rank, world_size=2, hostname="node0", pid=100 + rank, device="cpu")
        store.ingest(hello, T0 - 60)
        windows = rank_windows(RankSpec(rank=rank, stall_s=stall_s), "run", seconds=10.0, t_end=T0 + 10)
        for n, w in enumerate(windows):
            compiles, recompiles, compile_s = compile_windows.get(n, (0, 0, 0.0))
            w = msgspec.structs.replace(w, compiles=compiles, recompiles=recompiles, compile_s=compile_s)
            store.ingest(msgspec.structs.replace(w, graph_breaks=0), w.t1)
            if recompiles:
                store.ingest(Event(run_id="run", rank=rank, t=w.t1, kind="recompile", message=REASON), w.t1)
    return store


def test_three_recompiles_of_a_second_each_in_ten_seconds_are_named_with_function_reason_and_fix() -> None:
    store = compiled_run(compile_windows={0: (1, 0, 2.0), 4: (1, 1, 1.0), 8: (1, 1, 1.0), 12: (1, 1, 1.0)})
    findings = diagnose(summarize(store.snapshot(T0 + 10), span_s=None))
    top = findings[0]
    assert top.cause == "recompile" and top.severity == "critical", [f.title for f in findings]
    assert "'forward' (train.py:31) 3 times, 1.0 s each" in top.title, top.title
    assert "size mismatch at index 1" in top.title and "0/2" not in top.title, top.title
    assert "dynamic=True" in top.suggestion and "mark_dynamic" in top.suggestion, top.suggestion
    assert not any(f.cause == "stall" for f in findings), [f.title for f in findings]


def test_one_compile_at_the_start_is_no_finding() -> None:
    store = compiled_run(compile_windows={0: (1, 0, 3.0)})
    findings = diagnose(summarize(store.snapshot(T0 + 10), span_s=None))
    assert not any(f.cause in ("recompile", "stall") for f in findings), [f.title for f in findings]


def test_the_stall_rule_counts_only_what_compiling_leaves() -> None:
    stats = RankStats(windows=10, steps=100, dropped=0, step=StepTimes(per_s=10.0, mean_s=0.1, p50_s=0.1))
    stalls = msgspec.structs.replace(stats, stalls=StallFigures(steps=5, frac=0.4))
    assert stall_beyond_compiles(stalls) == (5, 0.4)  # nothing compiled: the stall rule's own figures
    compiled = msgspec.structs.replace(stalls, compile=CompileFigures(compiles=4, frac=0.35))
    steps, frac = stall_beyond_compiles(compiled)
    assert steps == 1 and abs(frac - 0.05) < 1e-9
