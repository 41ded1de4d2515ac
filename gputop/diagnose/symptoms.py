"""Which cause explains which symptom: one declared table, and the one pass that folds by it.

A measured cause outranks what it causes: a rotation shows as every rank
waiting in the exchange, a stall as exposed communication, CPU contention as a
slow loader, tiny steps as the all-reduce's latency.  Each row of ``EXPLAINS``
says which findings of a cause explain which findings of other causes, and how
the cause takes them in: its severity becomes their worst, its cost the
largest, and the symptoms stay listed, as info, with a pointer to it
(``fold_symptoms``), so nothing is hidden.

The rows apply in their order, which is their precedence: a symptom one row
took in is info by the next, which then leaves it alone (tiny steps take in
what they explain whatever its grade).  A run's rows fold before its titles
name their hosts, since a slow node's title quotes its straggler's words, notes
and all; CPU contention, judged per host across runs, folds after
(``after_hosts``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from gputop.diagnose.findings import Cause, Finding
from gputop.diagnose.grading import fold_symptoms
from gputop.diagnose.rules.cpu_contention import contention_explains, has_cpu_contention
from gputop.diagnose.rules.model_config import setting_explains
from gputop.diagnose.rules.parallelism import fold_fixed_costs, has_tiny_steps, tiny_steps_explain
from gputop.diagnose.rules.rotating import is_rotation, rotation_explains
from gputop.diagnose.rules.stall import SYMPTOM_WARN_FRAC, stall_explains
from gputop.diagnose.rules.straggler import is_loader_straggler
from gputop.model.figures import Figures

# How a cause's finding at an index takes its symptoms in, each symptom's title noting where it went.
Fold = Callable[[Sequence[Finding], int, Sequence[Finding], str], list[Finding]]


@dataclass(frozen=True)
class Explains:
    """One row: the findings of ``cause`` that ``is_cause`` picks explain the ``symptoms`` that ``explains`` says.

    ``symptoms`` declares the causes a row may take in; ``explains`` decides, among their findings, which.
    """

    cause: Cause
    symptoms: tuple[Cause, ...]
    is_cause: Callable[[Finding], bool]
    explains: Callable[[Finding, Finding, Figures], bool]  # (the cause's finding, a symptom's, the figures)
    note: str  # what each symptom's title adds: "(mostly the stalls, see stall)"
    fold: Fold = fold_symptoms
    after_hosts: bool = False


def input_explains(data_loading: Finding, finding: Finding) -> bool:
    """A straggler slow for its own data, where every rank's input is slow: the slowest of slow inputs."""
    return (
        finding.run_id == data_loading.run_id
        and finding.cause in data_loading.explains
        and is_loader_straggler(finding)
        and finding.severity != "info"
    )


EXPLAINS: tuple[Explains, ...] = (
    Explains(
        cause="desync",
        symptoms=("hang",),
        is_cause=lambda finding: True,
        explains=lambda desync, hang, _: hang.run_id == desync.run_id,  # a desync hangs gloo and NCCL alike
        note="the ranks issued different collectives, see desync",
        fold=partial(fold_symptoms, name_them=False),
    ),
    Explains(
        cause="straggler",
        symptoms=("communication",),
        is_cause=is_rotation,
        explains=lambda rotation, finding, _: rotation_explains(rotation, finding),
        note="mostly waiting for the slowest rank, see straggler",
    ),
    Explains(
        cause="data_loading",
        symptoms=("straggler",),
        is_cause=lambda finding: bool(finding.explains),  # judged over every rank, the slow-input stragglers too
        explains=lambda data_loading, finding, _: input_explains(data_loading, finding),
        note="its input is the slowest of slow inputs, see data_loading",
    ),
    Explains(
        cause="parallelism",
        symptoms=("communication", "straggler"),
        is_cause=has_tiny_steps,
        explains=lambda parallelism, finding, _: tiny_steps_explain(parallelism, finding),
        note="a symptom of tiny steps, see parallelism",
        fold=fold_fixed_costs,
    ),
    Explains(
        cause="stall",
        symptoms=tuple(SYMPTOM_WARN_FRAC),  # communication, straggler, data_loading
        is_cause=lambda finding: True,
        explains=lambda stall, finding, _: stall_explains(stall, finding),
        note="mostly the stalls, see stall",
        fold=partial(fold_symptoms, name_them=False),  # the stall's title keeps its own words: no "it shows as"
    ),
    Explains(
        cause="model_config",
        symptoms=("communication",),
        is_cause=lambda finding: bool(finding.explains),  # a DDP setting's (tiny buckets), not nn.DataParallel's
        explains=lambda config, finding, _: setting_explains(config, finding),
        note="a symptom of DDP's settings, see model_config",
    ),
    Explains(
        cause="allocation",
        symptoms=("communication", "data_loading", "straggler"),
        is_cause=has_cpu_contention,
        explains=contention_explains,
        note="a symptom of CPU contention, see allocation",
        after_hosts=True,
    ),
)


def fold_explained(findings: Sequence[Finding], figures: Figures, *, after_hosts: bool) -> list[Finding]:
    """The findings with each cause taking in the symptoms it explains, row by row of ``EXPLAINS``.

    ``after_hosts``: the rows that fold once every run's titles name their hosts, else a run's own rows.
    """
    out = list(findings)
    for row in (row for row in EXPLAINS if row.after_hosts == after_hosts):
        for index, cause in enumerate(list(out)):  # each cause as the row found it
            if cause.cause != row.cause or not row.is_cause(cause):
                continue
            symptoms = [f for f in out if f.cause in row.symptoms and row.explains(cause, f, figures)]
            if symptoms:
                out = row.fold(out, index, symptoms, row.note)
    return out
