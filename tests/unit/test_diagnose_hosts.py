"""Multi-host diagnosis: a host whose ranks are all slow is one slow node; findings name the host."""

from __future__ import annotations

from dataclasses import replace

from tests.support.diagnose_fixtures import RankSpec, findings_of, make_snapshot, straggler_of

FAST = RankSpec(forward_frac=0.2, backward_frac=0.3, comm_frac=0.45, overlap_frac=0.05)
SLOW = RankSpec(forward_frac=0.35, backward_frac=0.55, comm_frac=0.06, overlap_frac=0.05)


def cluster(slow_ranks: set[int], hosts: int = 3, per_host: int = 2) -> list[RankSpec]:
    return [
        replace(SLOW if r in slow_ranks else FAST, rank=r, hello={"hostname": f"node-{r // per_host}"})
        for r in range(hosts * per_host)
    ]


def test_every_rank_of_one_host_slow_is_a_slow_node_not_n_stragglers() -> None:
    found = findings_of(make_snapshot(cluster(slow_ranks={4, 5})))
    stragglers = [f for f in found if f.cause == "straggler"]
    assert len(stragglers) == 1, [f.title for f in found]
    (node,) = stragglers
    assert node.title.startswith("node-2 is a slow node: all 2 of its ranks are slow"), node.title
    assert node.ranks == (4, 5) and node.hostname == "node-2" and straggler_of(node).slow_node
    assert "node-2" in node.suggestion


def test_one_slow_rank_is_named_with_its_host() -> None:
    found = findings_of(make_snapshot(cluster(slow_ranks={3})))
    (straggler,) = [f for f in found if f.cause == "straggler"]
    assert straggler.title.startswith("node-1 rank 3 is slow"), straggler.title
    assert straggler.hostname == "node-1" and not straggler_of(straggler).slow_node


def test_a_single_host_run_reads_as_before() -> None:
    specs = [replace(SLOW if r == 1 else FAST, rank=r) for r in range(4)]  # all on node0
    (straggler,) = [f for f in findings_of(make_snapshot(specs)) if f.cause == "straggler"]
    assert straggler.title.startswith("rank 1 is slow") and straggler.hostname is None
