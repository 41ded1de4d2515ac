"""diagnose(figures): every rule over every run, findings worst first.

Pure and stateless: the same figures always give the same findings.  The
live panel wraps this in ``Diagnoser`` (persistence and hysteresis) and feeds
it the figures of its span; the report calls it once on the figures of a
whole recording.  The rules read ``gputop.model.figures`` and nothing else, so
their evidence quotes the numbers the dashboard and the report show.  Which
cause explains which symptom is ``gputop.diagnose.symptoms``' table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from gputop.diagnose.findings import CAUSES, Finding
from gputop.diagnose.rules.allocation import allocation_findings
from gputop.diagnose.rules.communication import communication_findings
from gputop.diagnose.rules.data_loading import data_loading_findings
from gputop.diagnose.rules.data_parallel import data_parallel_findings
from gputop.diagnose.rules.desync import desync_findings
from gputop.diagnose.rules.hang import hang_findings
from gputop.diagnose.rules.hosts import with_hosts
from gputop.diagnose.rules.memory import memory_findings
from gputop.diagnose.rules.model_config import model_config_findings
from gputop.diagnose.rules.parallelism import parallelism_findings
from gputop.diagnose.rules.recompile import recompile_findings
from gputop.diagnose.rules.stall import stall_findings
from gputop.diagnose.rules.straggler import is_loader_straggler, straggler_findings
from gputop.diagnose.rules.unobserved import unobserved_findings
from gputop.diagnose.symptoms import fold_explained
from gputop.diagnose.waste import with_waste
from gputop.model.figures import Figures, RunFigures


def diagnose(machine: Figures) -> list[Finding]:
    """The causes at work in each run over the figures' span, worst first."""
    ranks_on_host = machine.ranks_on_host()
    findings: list[Finding] = []
    for run in machine.runs:
        run_findings = fold_explained(rule_findings(run, machine, ranks_on_host), machine, after_hosts=False)
        findings += with_hosts(run_findings, run)  # slow nodes; titles name the host in multi-host runs
    findings += data_parallel_findings(machine)
    allocation = allocation_findings(machine)
    findings = fold_explained(findings + allocation, machine, after_hosts=True)
    reported = {(f.hostname or "", g) for f in allocation for g in f.gpus}
    findings += unobserved_findings(machine, gpus_already_reported=reported)
    return worst_first(with_waste(findings, machine))


def rule_findings(run: RunFigures, machine: Figures, ranks_on_host: dict[str, int]) -> list[Finding]:
    """Every rule's findings on one run, before any cause takes in its symptoms (``gputop.diagnose.symptoms``)."""
    # A live span is judged as the run goes; a report's whole history takes in the start with the rest.
    age_s = None if machine.span_s is None else machine.t - run.snapshot.first_seen_t
    stragglers = straggler_findings(run, ranks_on_host, age_s)
    config = model_config_findings(run)
    # A setting that makes the exchange itself costly (forty buckets of a few KiB) explains it before the step's
    # size does: more work per step would hide it, but the setting's fix removes it.
    exchange_explained = any("communication" in f.explains for f in config)
    hangs = hang_findings(run, machine.t)
    # Listed in the order findings of one severity and worth keep in the report (worst_first is stable).
    return [
        *stragglers,
        *communication_findings(run),
        *input_findings(stragglers, run, ranks_on_host),
        *parallelism_findings(run, exchange_explained=exchange_explained),
        *recompile_findings(run),
        *stall_findings(run),
        *hangs,
        *desync_findings(run, hung=bool(hangs)),
        *config,
        *memory_findings(run),
    ]


def input_findings(stragglers: list[Finding], run: RunFigures, ranks_on_host: dict[str, int]) -> list[Finding]:
    """The run's data_loading finding beside its stragglers: one slow rank's input, or slow input on every rank.

    A rank already named as a straggler for its own loader is not also a
    run-wide input problem, so it is left out of the run's loader wait.  But
    when the ranks that waited for it still wait for their own data past the
    line (while they waited in the exchange, their loaders had its time to
    prefetch, and still fell behind), every rank's input is slow: the finding
    is data_loading over all of them, and it explains the straggler, one rank's
    input a little slower than the rest, as its symptom.
    """
    loader_stragglers = {r for f in stragglers if is_loader_straggler(f) for r in f.ranks}
    others = data_loading_findings(run, ranks_on_host, exclude_ranks=loader_stragglers)
    if not loader_stragglers or all(f.severity == "info" for f in others):
        return others
    return [replace(f, explains=("straggler",)) for f in data_loading_findings(run, ranks_on_host)]


def worst_first(findings: Iterable[Finding]) -> list[Finding]:
    """Critical before warn before info; within one severity, what fixing it is worth (share of step time) first."""
    return sorted(
        findings,
        key=lambda f: (-f.severity_rank, -f.stake, CAUSES.index(f.cause), f.run_id or "", f.ranks, f.gpus),
    )
