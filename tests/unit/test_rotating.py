"""Chronic or rotating: the straggler finding says how often its rank was the slowest, and a rotation blames no one."""

from __future__ import annotations

import re

from gputop.diagnose import Finding, diagnose
from gputop.model.figures import summarize
from tests.support.diagnose_fixtures import RankSpec, findings_of, make_snapshot, straggler_of


def only(findings: list[Finding], cause: str) -> Finding:
    (finding,) = [f for f in findings if f.cause == cause]
    return finding


def summary(findings: list[Finding]) -> str:
    return " | ".join(f"[{f.severity}] {f.cause}: {f.title}" for f in findings)


# Four ranks whose exchange is exposed alike, 35% of each step: communication, by the means.
ALIKE = dict(forward_frac=0.2, backward_frac=0.3, comm_frac=0.40, overlap_frac=0.05)


def rotation(ranks: int, late_frac: float = 0.35) -> list[RankSpec]:
    """Rank r is ``late_frac`` of a step later than the others in steps n with n % ranks == r."""
    return [
        RankSpec(rank=r, ready_frac=0.2, ready_extra_frac=tuple(late_frac if k == r else 0.0 for k in range(ranks)),
                 **ALIKE)  # type: ignore[arg-type]
        for r in range(ranks)
    ]  # fmt: skip


def test_a_rotation_of_batches_of_uneven_size_names_the_data_and_how_to_even_it() -> None:
    """Padded to their longest text, the rank with the longest batch is a tenth of a step late at its forward's
    end, and three tenths at its backward's: the inputs' sizes say so, and the finding names the batches."""
    specs = [
        RankSpec(rank=r, ready_frac=0.2, ready_extra_frac=tuple(0.1 if k == r else 0.0 for k in range(2)),
                 input_numel_per_frac=10_000, **ALIKE)  # type: ignore[arg-type]
        for r in range(2)
    ]  # fmt: skip
    findings = findings_of(make_snapshot(specs))
    top = findings[0]
    assert (top.cause, top.ranks) == ("straggler", ()), summary(findings)
    assert "the others wait for it 30% of each step" in top.title, top.title
    assert "the one that drew the largest batch (forward length follows input size, ρ = 1.00)" in top.title
    assert "group_by_length" in top.suggestion and top.to_dict()["slowest"]["input_driven"] == 1.0
    unsized = [RankSpec(**{**vars(spec), "input_numel_per_frac": 0}) for spec in specs]
    plain = only(findings_of(make_snapshot(unsized)), "straggler")
    assert "largest batch" not in plain.title and "the others wait for it 10% of each step" in plain.title


def test_a_chronic_stragglers_finding_says_it_was_the_slowest_in_nearly_every_step() -> None:
    """Rank 1 waits 40% of each step for data and is the last one ready in every step."""
    specs = [
        RankSpec(rank=0, loader_frac=0.01, forward_frac=0.2, backward_frac=0.3, comm_frac=0.45, overlap_frac=0.05,
                 ready_frac=0.21),
        RankSpec(rank=1, loader_frac=0.40, forward_frac=0.2, backward_frac=0.3, comm_frac=0.07, overlap_frac=0.05,
                 ready_frac=0.60),
    ]  # fmt: skip
    finding = only(findings_of(make_snapshot(specs)), "straggler")
    assert finding.ranks == (1,) and straggler_of(finding).phase == "loader"
    assert re.search(r"; it was the slowest in 100% of the last \d+ steps$", finding.title), finding.title
    assert finding.to_dict()["slowest"]["one_rank"] == 1


def test_a_rotation_is_the_finding_and_the_exchange_its_symptom() -> None:
    """A different rank of four is late each step: by the means every rank just waits in the all-reduce."""
    findings = findings_of(make_snapshot(rotation(4)))
    top = findings[0]
    assert (top.cause, top.severity, top.ranks) == ("straggler", "critical", ()), summary(findings)
    assert top.title.startswith(
        "the slowest rank rotates: rank 0 in 25%, rank 1 in 25%, rank 2 in 25%, 1 more rank in 25% of the last "
    ), top.title
    assert "the others wait for it 35% of each step" in top.title and "it shows as communication" in top.title
    assert "No one rank is slow" in top.suggestion and "sequence lengths" in top.suggestion
    assert straggler_of(top).rotating and top.to_dict()["slowest"]["rotates"] is True
    communication = only(findings, "communication")
    assert communication.severity == "info" and "waiting for the slowest rank" in communication.title


def test_without_readiness_the_same_job_reads_as_communication() -> None:
    """Older reporters send no readiness: the rotation is invisible, and the means say communication."""
    specs = [RankSpec(rank=r, **ALIKE) for r in range(4)]  # type: ignore[arg-type]
    findings = findings_of(make_snapshot(specs))
    assert [f.cause for f in findings if f.severity != "info"] == ["communication"], summary(findings)


def test_ranks_ready_together_leave_the_means_to_decide() -> None:
    """Same exchange, every rank ready at the same moment within its jitter: no rotation, communication."""
    specs = [RankSpec(rank=r, ready_frac=0.2, **ALIKE) for r in range(4)]  # type: ignore[arg-type]
    findings = findings_of(make_snapshot(specs))
    assert [f.cause for f in findings if f.severity != "info"] == ["communication"], summary(findings)


def test_a_young_rotation_is_not_called_live_but_is_in_a_report() -> None:
    young = make_snapshot(rotation(2), age_s=12.0)
    findings = findings_of(young)
    assert [f for f in findings if f.cause == "straggler"] == []  # nothing of the ranks' speed while they start
    assert only(findings, "communication").severity == "critical"  # judged on its own until the rotation is called
    assert only(diagnose(summarize(young, span_s=None)), "straggler").severity == "critical"


def test_a_rotation_on_starved_cores_is_a_symptom_of_the_contention() -> None:
    """Both ranks wait for a CPU 60% of the time: whichever one the scheduler squeezes is late."""
    specs = [RankSpec(**{**vars(spec), "cpu_starved_frac": 0.6}) for spec in rotation(2)]
    findings = findings_of(make_snapshot(specs, hello={"cpu_count": 2}))
    assert findings[0].cause == "allocation", summary(findings)
    straggler = only(findings, "straggler")
    assert straggler.severity == "info" and "CPU contention" in straggler.title, straggler.title
