"""model_config: settings that leave a CUDA GPU's fast paths unused.

Read from the facts each rank sends in its hello (autocast seen during forward,
the parameters' dtype, the TF32 and cudnn.benchmark flags).  A fact that is
unknown (None) is never read as "off", and CPU runs get no finding: these
settings only exist for CUDA devices.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gputop.diagnose.findings import Evidence, Finding, Severity
from gputop.diagnose.grading import doc_anchor
from gputop.diagnose.thresholds import AMPERE_OR_NEWER_GPU_NAMES, TENSOR_CORE_GPU_NAMES
from gputop.diagnose.wording import ranks_text
from gputop.model.figures import RankFigures, RunFigures

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
    """One finding per run naming every setting that is off, worst severity first."""
    cuda = [r for r in run.active if r.on_cuda]
    if not cuda:
        return []
    rank = cuda[0]  # settings are per script, so the ranks agree; the first speaks for all
    gpu_name = rank.hello.device_name or (rank.gpu.name if rank.gpu is not None else None)
    tensor_cores = name_matches(gpu_name, TENSOR_CORE_GPU_NAMES)
    ampere = name_matches(gpu_name, AMPERE_OR_NEWER_GPU_NAMES)

    problems: list[tuple[Severity, str, str, str]] = []  # severity, fact, what, fix
    if full_precision(rank):
        problems.append(
            (
                "warn" if tensor_cores else "info",
                "autocast_on",
                "no autocast, float32 parameters",
                "with torch.autocast('cuda', dtype=torch.bfloat16): around forward and loss",
            )
        )
    if rank.hello.tf32_matmul is False and ampere and full_precision(rank):
        problems.append(("warn", "tf32_matmul_on", "TF32 matmul off", "torch.backends.cuda.matmul.allow_tf32 = True"))
    if rank.hello.tf32_cudnn is False and ampere and full_precision(rank):
        problems.append(("info", "tf32_cudnn_on", "TF32 cuDNN off", "torch.backends.cudnn.allow_tf32 = True"))
    if rank.hello.cudnn_benchmark is False:
        problems.append(
            (
                "info",
                "cudnn_benchmark_on",
                "cudnn.benchmark off",
                "torch.backends.cudnn.benchmark = True (convnets with fixed input shapes)",
            )
        )
    if not problems:
        return []
    severity: Severity = "warn" if any(p[0] == "warn" for p in problems) else "info"
    problems.sort(key=lambda p: p[0] != "warn")
    on = f" on {gpu_name}" if gpu_name else ""
    return [
        Finding(
            cause="model_config",
            severity=severity,
            title=f"{ranks_text([r.rank for r in cuda])}{on}: " + ", ".join(p[2] for p in problems),
            suggestion="; ".join(p[3] for p in problems) + ".",
            evidence=tuple(Evidence(p[1], 0.0, 1.0, op="<") for p in problems),
            ranks=tuple(r.rank for r in cuda),
            run_id=run.run_id,
            doc=doc_anchor("model_config"),
        )
    ]
