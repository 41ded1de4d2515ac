"""Properties of diagnose over arbitrary windows: it never raises, and what it says is well formed."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gputop.collect.store import Store
from gputop.diagnose import CAUSES, SEVERITIES, diagnose, thresholds
from gputop.model.figures import summarize
from gputop.model.snapshot import Snapshot
from gputop.protocol import Hello, Window

DOCS = Path(__file__).resolve().parents[2] / "docs" / "diagnosis.md"

maybe_s = st.none() | st.floats(min_value=0.0, max_value=10.0)
maybe_pct = st.none() | st.floats(min_value=0.0, max_value=1000.0)
maybe_bytes = st.none() | st.integers(min_value=0, max_value=1 << 40)
maybe_count = st.none() | st.integers(min_value=0, max_value=1000)


@st.composite
def windows(draw: st.DrawFn, rank: int) -> list[Window]:
    out = []
    total = 0
    for seq in range(draw(st.integers(min_value=0, max_value=12))):
        steps = draw(st.integers(min_value=0, max_value=50))
        total += steps
        out.append(
            Window(
                run_id="run",
                rank=rank,
                seq=seq,
                t0=seq * 0.5,
                t1=seq * 0.5 + 0.5,
                steps=steps,
                step_total=total,
                step_time_sum_s=draw(st.floats(min_value=0.0, max_value=10.0)),
                step_time_p50_s=draw(maybe_s),
                gpu_step_time_p50_s=draw(maybe_s),
                loader_wait_s=draw(st.floats(min_value=0.0, max_value=10.0)),
                loader_batches=draw(st.integers(min_value=0, max_value=50)),
                forward_s=draw(maybe_s),
                backward_s=draw(maybe_s),
                comm_s=draw(maybe_s),
                overlap_s=draw(maybe_s),
                mem_allocated_bytes=draw(maybe_bytes),
                mem_reserved_bytes=draw(maybe_bytes),
                mem_peak_bytes=draw(maybe_bytes),
                mem_total_bytes=draw(maybe_bytes),
                alloc_retries=draw(maybe_count),
                ooms=draw(maybe_count),
                cpu_pct=draw(maybe_pct),
                workers=draw(maybe_count),
                workers_cpu_pct=draw(maybe_pct),
            )
        )
    return out


@st.composite
def hellos(draw: st.DrawFn, rank: int, world: int) -> Hello:
    return Hello(
        run_id="run",
        rank=rank,
        world_size=world,
        hostname=draw(st.sampled_from(["a", "b"])),
        device=draw(st.sampled_from([None, "cpu", "cuda:0"])),
        device_name=draw(st.sampled_from([None, "NVIDIA A100-SXM4-80GB", "Tesla P100"])),
        loader_batch_size=draw(maybe_count),
        loader_num_workers=draw(maybe_count),
        autocast=draw(st.none() | st.booleans()),
        param_dtype=draw(st.sampled_from([None, "float32", "bfloat16"])),
        tf32_matmul=draw(st.none() | st.booleans()),
        cudnn_benchmark=draw(st.none() | st.booleans()),
        torch_threads=draw(maybe_count),
        cpu_count=draw(maybe_count),
    )


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    store = Store()
    world = draw(st.integers(min_value=1, max_value=4))
    for rank in range(world):
        store.ingest(draw(hellos(rank, world)), 0.0)
        for window in draw(windows(rank)):
            store.ingest(window, window.t1)
    return store.snapshot(6.0)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots(), st.floats(min_value=0.5, max_value=1e6))
def test_diagnose_never_raises_and_findings_are_well_formed(snapshot: Snapshot, span_s: float) -> None:
    findings = diagnose(summarize(snapshot, span_s=span_s))
    for finding in findings:
        assert finding.cause in CAUSES and finding.severity in SEVERITIES
        assert finding.doc == f"docs/diagnosis.md#{finding.cause}"
        assert finding.title and finding.suggestion
        finding.to_dict()  # serialisable for the report
        for evidence in finding.evidence:
            str(evidence)
    ranks = [(-f.severity_rank, -f.stake) for f in findings]  # worst first: severity, then what fixing it is worth
    assert ranks == sorted(ranks)


def test_docs_have_a_section_per_cause_and_every_threshold() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for cause in CAUSES:
        assert f'<a id="{cause}"></a>' in text or f"## {cause}" in text, cause
    names = [n for n in vars(thresholds) if n.isupper()]
    missing = [n for n in names if n not in text]
    assert missing == [], f"docs/diagnosis.md does not mention {missing}"
