"""diagnose(figures): every rule over every run, findings worst first.

Pure and stateless: the same figures always give the same findings.  The
live panel wraps this in ``Diagnoser`` (persistence and hysteresis) and feeds
it the figures of its span; the report calls it once on the figures of a
whole recording.  The rules read ``gputop.model.figures`` and nothing else, so
their evidence quotes the numbers the dashboard and the report show.
"""

from __future__ import annotations

from collections.abc import Iterable

from gputop.diagnose.details import StragglerDetails
from gputop.diagnose.findings import CAUSES, Finding
from gputop.diagnose.grading import fold_symptoms
from gputop.diagnose.rules.allocation import allocation_findings
from gputop.diagnose.rules.communication import communication_findings
from gputop.diagnose.rules.cpu_contention import absorb_cpu_symptoms
from gputop.diagnose.rules.data_loading import data_loading_findings
from gputop.diagnose.rules.data_parallel import data_parallel_findings
from gputop.diagnose.rules.hang import hang_findings
from gputop.diagnose.rules.hosts import with_hosts
from gputop.diagnose.rules.memory import memory_findings
from gputop.diagnose.rules.model_config import absorb_config_symptoms, model_config_findings
from gputop.diagnose.rules.parallelism import absorb_fixed_costs, parallelism_findings
from gputop.diagnose.rules.recompile import recompile_findings
from gputop.diagnose.rules.rotating import absorb_rotation_symptoms
from gputop.diagnose.rules.stall import absorb_stall_symptoms, stall_findings
from gputop.diagnose.rules.straggler import straggler_findings
from gputop.diagnose.rules.unobserved import unobserved_findings
from gputop.diagnose.waste import with_waste
from gputop.model.figures import Figures, RunFigures


def diagnose(machine: Figures) -> list[Finding]:
    """The causes at work in each run over the figures' span, worst first."""
    ranks_on_host = machine.ranks_on_host()
    findings: list[Finding] = []
    for run in machine.runs:
        # A live span is judged as the run goes; a report's whole history takes in the start with the rest.
        age_s = None if machine.span_s is None else machine.t - run.view.first_seen_t
        stragglers = straggler_findings(run, ranks_on_host, age_s)
        run_findings = absorb_rotation_symptoms(stragglers + communication_findings(run))
        run_findings = with_input_findings(run_findings, run, ranks_on_host)
        # A setting that makes the exchange itself costly (forty buckets of a few KiB) explains it before the step's
        # size does: more work per step would hide it, but the setting's fix removes it.
        config = model_config_findings(run)
        explained = {cause for f in config for cause in f.explains}
        for parallelism in parallelism_findings(run, exchange_explained="communication" in explained):
            parallelism, run_findings = absorb_fixed_costs(parallelism, run_findings)
            run_findings.append(parallelism)
        run_findings += recompile_findings(run)
        run_findings = absorb_stall_symptoms(run_findings + stall_findings(run))
        run_findings += hang_findings(run, machine.t)
        run_findings = absorb_config_symptoms(run_findings + config)
        run_findings += memory_findings(run)
        findings += with_hosts(run_findings, run)  # slow nodes; titles name the host in multi-host runs
    findings += data_parallel_findings(machine)
    allocation = allocation_findings(machine)
    findings = absorb_cpu_symptoms(findings + allocation, machine)
    reported = {(f.hostname or "", g) for f in allocation for g in f.gpus}
    findings += unobserved_findings(machine, gpus_already_reported=reported)
    return worst_first(with_waste(findings, machine))


def with_input_findings(findings: list[Finding], run: RunFigures, ranks_on_host: dict[str, int]) -> list[Finding]:
    """The run's data_loading finding beside its stragglers: one slow rank's input, or slow input on every rank.

    A rank already named as a straggler for its own loader is not also a
    run-wide input problem, so it is left out of the run's loader wait.  But
    when the ranks that waited for it still wait for their own data past the
    line (while they waited in the exchange, their loaders had its time to
    prefetch, and still fell behind), every rank's input is slow: the finding
    is data_loading over all of them, and the straggler, one rank's input a
    little slower than the rest, its symptom.
    """
    loader_stragglers = {r for f in findings if is_loader_straggler(f) for r in f.ranks}
    others = data_loading_findings(run, ranks_on_host, exclude_ranks=loader_stragglers)
    if not loader_stragglers or all(f.severity == "info" for f in others):
        return findings + others
    out = findings + data_loading_findings(run, ranks_on_host)
    symptoms = [f for f in out if is_loader_straggler(f) and f.severity != "info"]
    index = next((i for i, f in enumerate(out) if f.cause == "data_loading"), None)
    if index is None or not symptoms:
        return out
    return fold_symptoms(out, index, symptoms, "its input is the slowest of slow inputs, see data_loading")


def is_loader_straggler(finding: Finding) -> bool:
    """A straggler finding whose slow rank's time goes to waiting for its own data."""
    return isinstance(finding.details, StragglerDetails) and finding.details.phase == "loader"


def worst_first(findings: Iterable[Finding]) -> list[Finding]:
    """Critical before warn before info; within one severity, what fixing it is worth (share of step time) first."""
    return sorted(
        findings,
        key=lambda f: (-f.severity_rank, -f.stake, CAUSES.index(f.cause), f.run_id or "", f.ranks, f.gpus),
    )
