"""Findings across hosts: a host whose ranks are all slow is a slow node, and titles name the host.

Post-processing of one run's findings, pure.  In a multi-host run the
straggler rule can name every rank of one host (8 ranks on a node with a slower
GPU, a throttled CPU or a busy NIC); that is one slow node, not 8 stragglers, and
the fix is the node's, not each rank's.  Elsewhere a finding about ranks on one
host says which host ("node-3 rank 25 is slow"), and carries it in ``hostname``
for the exporter's ``Hostname`` label.  A single-host run is left as it was.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from gputop.diagnose.details import StragglerDetails
from gputop.diagnose.findings import Finding
from gputop.model.figures import RunFigures

MIN_RANKS_FOR_A_NODE = 2  # one rank alone on a host is a straggler like any other


def ranks_by_host(run: RunFigures) -> dict[str, set[int]]:
    hosts: dict[str, set[int]] = defaultdict(set)
    for rank in run.active:
        hosts[rank.hello.hostname].add(rank.rank)
    return dict(hosts)


def with_hosts(findings: list[Finding], run: RunFigures) -> list[Finding]:
    """The run's findings with slow nodes named as such and single-host findings naming their host."""
    hosts = ranks_by_host(run)
    if len(hosts) < 2:
        return findings
    host_of = {rank: host for host, ranks in hosts.items() for rank in ranks}
    out = []
    for finding in findings:
        on = {host_of.get(rank, "") for rank in finding.ranks}
        if not finding.ranks or len(on) != 1 or "" in on:
            out.append(finding)
            continue
        (host,) = on
        whole_node = set(finding.ranks) == hosts[host] and len(hosts[host]) >= MIN_RANKS_FOR_A_NODE
        if isinstance(finding.details, StragglerDetails) and whole_node:
            out.append(_slow_node(finding, finding.details, host, len(hosts[host])))
        elif finding.title.startswith("rank"):
            out.append(replace(finding, title=f"{host} {finding.title}", hostname=host))
        else:
            out.append(replace(finding, hostname=host))
    return out


def _slow_node(finding: Finding, details: StragglerDetails, host: str, ranks: int) -> Finding:
    # The straggler title reads "ranks 8-15 are slow: rank 9: <phase> ...; the others wait ...".
    detail = finding.title.split(": ", 1)[1] if ": " in finding.title else finding.title
    return replace(
        finding,
        title=f"{host} is a slow node: all {ranks} of its ranks are slow ({detail})",
        suggestion=(
            f"The whole node {host} is slower, not one rank: compare its GPUs, CPU load, clocks and "
            f"network with another node's (nvidia-smi -q, top, ethtool), or leave it out of the job. "
            + finding.suggestion
        ),
        hostname=host,
        details=replace(details, slow_node=True),
    )
