"""model_config: settings that leave a CUDA GPU's fast paths unused, and DDP built to cost time.

Read from the facts each rank sends in its hello (autocast seen during forward,
the parameters' dtype, the TF32 and cudnn.benchmark flags; DDP's own settings,
``ddp_settings``).  A fact that is unknown (None) is never read as "off"; the
precision settings only exist for CUDA devices, DDP's hold on the CPU too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gputop.diagnose.findings import Evidence, Finding, Severity
from gputop.diagnose.rules.ddp_settings import Problem, ddp_problems
from gputop.diagnose.thresholds import AMPERE_OR_NEWER_GPU_NAMES, TENSOR_CORE_GPU_NAMES
from gputop.diagnose.wording import ranks_text
from gputop.model.figures import RankFigures, RunFigures
from gputop.peaks import peak_flops

FULL_PRECISION = ("float32", "torch.float32", "float64", "torch.float64")


def name_matches(device_name: str | None, fragments: Sequence[str]) -> bool | None:
    """Whether a GPU name contains one of the fragments at a word start; None if no name."""
    if not device_name:
        return None
    name = device_name.lower()
    return any(re.search(r"(?<![a-z0-9])" + re.escape(fragment), name) for fragment in fragments)


def full_precision(rank: RankFigures) -> bool:
    """Autocast seen off and the parameters in fp32: every matmul runs in full precision."""
    return rank.hello.autocast is False and rank.hello.param_dtype in FULL_PRECISION


def model_config_findings(run: RunFigures) -> list[Finding]:
    """One finding per run naming every setting that wastes the hardware, worst severity first."""
    cuda = [r for r in run.active if r.on_cuda]
    ddp = [r for r in run.active if r.hello.ddp]
    # Settings are per script, so the ranks agree: the first rank speaks for all.
    cuda_found = cuda_problems(cuda[0]) if cuda else []
    ddp_found = ddp_problems(ddp[0]) if ddp else []
    problems = cuda_found + ddp_found
    if not problems:
        return []
    severity: Severity = "warn" if any(p.severity == "warn" for p in problems) else "info"
    problems.sort(key=lambda p: p.severity != "warn")
    ranks = sorted({r.rank for r in cuda if cuda_found} | {r.rank for r in ddp if ddp_found})
    gpu_name = gpu_name_of(cuda[0]) if cuda else None
    on = f" on {gpu_name}" if gpu_name else ""
    return [
        Finding(
            cause="model_config",
            severity=severity,
            title=f"{ranks_text(ranks)}{on}: " + ", ".join(p.what for p in problems),
            suggestion="; ".join(p.fix for p in problems) + ".",
            evidence=tuple(p.evidence for p in problems),
            ranks=tuple(ranks),
            run_id=run.run_id,
            explains=tuple(sorted({cause for p in problems for cause in p.explains})),
        )
    ]


def setting_explains(config: Finding, finding: Finding) -> bool:
    """A finding a wasteful setting causes: of a cause the setting explains, in its run, past its own line.

    Forty gradient buckets of a few KiB each pay an all-reduce's latency forty
    times: the exposed exchange that follows is the setting's cost, and its fix
    (``bucket_cap_mb``), not compressing gradients, is what helps.
    """
    return finding.run_id == config.run_id and finding.cause in config.explains and finding.severity != "info"


def gpu_name_of(rank: RankFigures) -> str | None:
    return rank.hello.device_name or (rank.gpu.name if rank.gpu is not None else None)


# Turning TF32 on for float32 matmuls and convolutions, by API: torch 2.9+'s (True), the legacy flags (False).
TF32_FIXES = {
    True: ('torch.backends.cuda.matmul.fp32_precision = "tf32"', 'torch.backends.cudnn.conv.fp32_precision = "tf32"'),
    False: ("torch.backends.cuda.matmul.allow_tf32 = True", "torch.backends.cudnn.allow_tf32 = True"),
}


def fp32_precision_api(torch_version: str | None) -> bool:
    """torch 2.9+ sets TF32 through ``fp32_precision``; its legacy ``allow_tf32`` then raises if both are used."""
    found = re.match(r"(\d+)\.(\d+)", torch_version or "")
    return found is not None and (int(found[1]), int(found[2])) >= (2, 9)


def cuda_problems(rank: RankFigures) -> list[Problem]:
    """Precision and kernel-selection settings of a CUDA rank (unknown facts are never "off")."""
    gpu_name = gpu_name_of(rank)
    tensor_cores = name_matches(gpu_name, TENSOR_CORE_GPU_NAMES)
    ampere = name_matches(gpu_name, AMPERE_OR_NEWER_GPU_NAMES)
    problems: list[Problem] = []

    def off(severity: Severity, fact: str, what: str, fix: str) -> None:
        problems.append(Problem(severity, Evidence(fact, 0.0, 1.0, op="<"), what, fix))

    if full_precision(rank):
        off(
            "warn" if tensor_cores else "info",
            "autocast_on",
            "no autocast, float32 parameters" + _bf16_share_text(rank, gpu_name),
            "with torch.autocast('cuda', dtype=torch.bfloat16): around forward and loss",
        )
    matmul, conv = TF32_FIXES[fp32_precision_api(rank.hello.torch_version)]
    if rank.hello.tf32_matmul is False and ampere and full_precision(rank):
        off("warn", "tf32_matmul_on", "TF32 matmul off", matmul)
    if rank.hello.tf32_cudnn is False and ampere and full_precision(rank):
        off("info", "tf32_cudnn_on", "TF32 cuDNN off", conv)
    if rank.hello.cudnn_benchmark is False:
        off(
            "info",
            "cudnn_benchmark_on",
            "cudnn.benchmark off",
            "torch.backends.cudnn.benchmark = True (convnets with fixed input shapes)",
        )
    return problems


def _bf16_share_text(rank: RankFigures, gpu_name: str | None) -> str:
    """What the step's counted FLOP/s reach of the GPU's bf16 tensor-core peak, the figure autocast works
    towards: " (the step reaches 3.1% of its bf16 peak)", or "" where the work or the peak is not known."""
    achieved = rank.stats.work.achieved_flops_per_s
    if achieved is None or not gpu_name:
        return ""
    peak, _ = peak_flops(gpu_name, "bfloat16", False)
    if not peak:
        return ""
    return f" (the step reaches {100.0 * achieved / peak:.1f}% of its bf16 peak)"
