"""data_loading: the GPU waits for input, and a DataLoader setting that would help.

The measure is the loader-wait share: time blocked in the tracked loader's
``next()`` over wall step time.  The suggestion is computed from the rank's own
facts (workers now, pin_memory, CPUs per rank on its host), never a fixed line.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from gputop.diagnose.findings import Evidence, Finding
from gputop.diagnose.grading import BAND_ERRORS, grade_band, mean_step_s, measured
from gputop.diagnose.thresholds import (
    CPU_STARVED_WARN_FRAC,
    LOADER_WAIT_CRITICAL_FRAC,
    LOADER_WAIT_WARN_FRAC,
    SUGGESTED_MIN_WORKERS,
    WORKER_SATURATED_PCT,
)
from gputop.diagnose.wording import pct, ranks_text, too_close_text
from gputop.model.figures import RankFigures, RunFigures

# The title names the rank that waits longest beside the ranks' mean when it waits this many times the mean:
# one rank's slow worker among several ranks waiting alike is worth a word, a rank a little above the mean is not.
WORST_NAMED_OVER_MEAN = 1.5


def data_loading_findings(
    run: RunFigures, ranks_on_host: Mapping[str, int], *, exclude_ranks: Collection[int] = ()
) -> list[Finding]:
    """One finding per run when its ranks, on average, wait for data past the threshold.

    ``exclude_ranks`` are ranks a straggler finding already blamed on their own
    loader: one slow rank is a straggler, not a run-wide input problem.
    """
    ranks = [r for r in measured(run) if r.stats.phases.loader_wait_frac is not None and r.rank not in exclude_ranks]
    if not ranks:
        return []
    mean_frac = sum(r.stats.phases.loader_wait_frac or 0.0 for r in ranks) / len(ranks)
    errors = [r.stats.phases.loader_wait_frac_se for r in ranks]
    # The mean's error from the ranks' own (independent enough: each rank has its own loader).
    se = None if None in errors else sum(e * e for e in errors if e is not None) ** 0.5 / len(ranks)
    severity, close = grade_band(mean_frac, se, LOADER_WAIT_WARN_FRAC, LOADER_WAIT_CRITICAL_FRAC)
    if severity is None and not close:
        return []
    waiting = [r for r in ranks if (r.stats.phases.loader_wait_frac or 0.0) > LOADER_WAIT_WARN_FRAC] or ranks
    worst = max(waiting, key=lambda r: r.stats.phases.loader_wait_frac or 0.0)
    threshold = LOADER_WAIT_CRITICAL_FRAC if severity == "critical" else LOADER_WAIT_WARN_FRAC
    spread = None if se is None else pct(BAND_ERRORS * se)
    evidence = [Evidence("loader_wait_pct", pct(mean_frac), pct(threshold), "%", spread=spread)]
    if len(ranks) > 1:
        evidence.append(
            Evidence(
                "loader_wait_pct", pct(worst.stats.phases.loader_wait_frac or 0.0), pct(threshold), "%", rank=worst.rank
            )
        )
    evidence.extend(worker_evidence(worst))
    verb = "waits" if len(waiting) == 1 else "wait"
    title = f"{ranks_text([r.rank for r in waiting])} {verb} for data {pct(mean_frac):.0f}% of each step"
    if severity is None:
        title += f": {too_close_text(mean_frac, se, threshold, min(r.stats.steps for r in ranks))}"
    if len(waiting) > 1 and (worst.stats.phases.loader_wait_frac or 0.0) > WORST_NAMED_OVER_MEAN * mean_frac:
        title += f" (rank {worst.rank}: {pct(worst.stats.phases.loader_wait_frac or 0.0):.0f}%)"
    return [
        Finding(
            cause="data_loading",
            severity=severity or "info",
            title=title,
            suggestion=loader_suggestion(worst, ranks_on_host.get(worst.hello.hostname, 1)),
            evidence=tuple(evidence),
            ranks=tuple(sorted(r.rank for r in waiting)),
            run_id=run.run_id,
            magnitude=mean_frac,
            cost_s=sum(r.stats.phases.loader_wait_s or 0.0 for r in ranks) / len(ranks),
            step_s=mean_step_s(ranks),
        )
    ]


def worker_evidence(rank: RankFigures) -> list[Evidence]:
    """The workers' CPU use, when they are saturated: the loader is CPU-bound."""
    per_worker = per_worker_cpu_pct(rank)
    if per_worker is None or per_worker <= WORKER_SATURATED_PCT:
        return []
    return [Evidence("cpu_pct_per_worker", per_worker, WORKER_SATURATED_PCT, "%", rank=rank.rank)]


def per_worker_cpu_pct(rank: RankFigures) -> float | None:
    workers = rank.stats.cpu.workers
    if rank.stats.cpu.workers_pct is None or not workers:
        return None
    return rank.stats.cpu.workers_pct / workers


def loader_suggestion(rank: RankFigures, ranks_on_host: int) -> str:
    """A DataLoader call with more workers than now, bounded by this rank's share of the CPUs."""
    hello = rank.hello
    workers_now = hello.loader_num_workers if hello.loader_num_workers is not None else rank.stats.cpu.workers
    cpu_share = max(hello.cpu_count // max(ranks_on_host, 1), 1) if hello.cpu_count else None
    per_worker = per_worker_cpu_pct(rank)
    saturated = per_worker is not None and per_worker > WORKER_SATURATED_PCT

    wanted = max(SUGGESTED_MIN_WORKERS, 2 * workers_now) if workers_now else SUGGESTED_MIN_WORKERS
    target = min(wanted, cpu_share) if cpu_share is not None else wanted
    where = ""
    if cpu_share is not None:
        where = f" ({hello.cpu_count} CPUs shared by {ranks_on_host} rank{'s' if ranks_on_host != 1 else ''})"

    starved = rank.stats.cpu.workers_starved_frac
    if workers_now and starved is not None and starved > CPU_STARVED_WARN_FRAC:
        return (
            f"The {workers_now} workers wait for a CPU {pct(starved):.0f}% of the time they are ready to run{where}: "
            "the CPUs are oversubscribed (see allocation), so more workers would make it worse; use fewer ranks "
            "or workers per host, make each sample cheaper, or give the job more CPUs."
        )
    if workers_now is not None and target <= workers_now:
        if saturated:
            return (
                f"The {workers_now} workers already use this rank's share of the CPUs{where}: make each sample "
                "cheaper (decode or augment on the GPU, preprocess once offline, cache decoded data) or give "
                "the job more CPUs."
            )
        return (
            f"The {workers_now} workers are not CPU-bound, so the wait is likely I/O: read from faster storage, "
            f"shard or cache the data, or raise prefetch_factor{where}."
        )

    args = [f"num_workers={target}"]
    if rank.on_cuda and hello.loader_pin_memory is not True:
        args.append("pin_memory=True")
    if hello.loader_persistent_workers is not True:
        args.append("persistent_workers=True")
    now = f"; now num_workers={workers_now}" if workers_now is not None else ""
    return f"DataLoader({', '.join(args)}){now}{where}."
