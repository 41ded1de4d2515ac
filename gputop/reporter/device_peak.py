"""What the rank's device can do, read where the work is counted: whether float32 matrix work may run on TF32
tensor cores, and a CPU's achievable matmul peak, measured once (no table can know a CPU's).  This module imports
torch only inside functions.
"""

from __future__ import annotations

import time


def tf32_modes() -> tuple[bool | None, bool | None]:
    """Whether float32 matrix multiplications and float32 convolutions may run on TF32 tensor cores now:
    (matmul, conv).  torch 2.9+'s ``fp32_precision`` first, then the older flags: reading ``allow_tf32``
    raises once a script has set the new one, so a script on the new API read through the old flags alone
    would have no TF32 fact.  None where torch cannot say.
    """
    try:
        import torch
    except Exception:
        return None, None
    matmul: bool | None = None
    conv: bool | None = None
    try:
        precision = getattr(torch.backends.cuda.matmul, "fp32_precision", "none")
        if precision in ("tf32", "ieee"):
            matmul = precision == "tf32"
        else:
            matmul = torch.get_float32_matmul_precision() in ("high", "medium")
    except Exception:
        pass
    try:
        precision = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", "none")
        conv = precision == "tf32" if precision in ("tf32", "ieee") else bool(torch.backends.cudnn.allow_tf32)
    except Exception:
        pass
    return matmul, conv


def measure_cpu_peak(
    size: int = 512, budget_s: float = 0.15, dtype: str = "float32"
) -> tuple[float | None, float, str]:
    """What this rank's CPU achieves on a dense matmul, measured once on the calling thread with torch's
    current thread count: (FLOP/s or None, seconds it cost, why None).

    A ``size`` x ``size`` matmul (512: three float32 matrices in 3 MiB, in a server CPU's cache; 256 read ~20%
    lower here, 1024 no higher), repeated for about ``budget_s`` after one warm-up call; the best of several
    batches of at least 5 ms, as ``timeit`` does, so a moment's contention does not lower it.  The peak a CPU
    rank's MFU is read against: no table can know a CPU's (docs/mfu.md: 200 GFLOP/s for 152 ms on 2 EPYC
    cores).
    """
    started = time.perf_counter()
    try:
        import torch

        kind = getattr(torch, dtype)
        a = torch.randn(size, size).to(kind)
        b = torch.randn(size, size).to(kind)
        out = torch.empty(size, size, dtype=kind)
        flops_per_call = 2 * size**3
        torch.mm(a, b, out=out)  # warm-up: the first call allocates and picks the kernel
        best = float("inf")
        calls = 1
        deadline = started + budget_s
        while True:
            t0 = time.perf_counter()
            for _ in range(calls):
                torch.mm(a, b, out=out)
            elapsed = time.perf_counter() - t0
            if elapsed < 0.005:  # batches of at least ~5 ms: a clock read is no part of the figure
                calls *= 2
                continue
            best = min(best, elapsed / calls)
            if time.perf_counter() >= deadline:
                break
        return flops_per_call / best, time.perf_counter() - started, ""
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"[:200]
        return None, time.perf_counter() - started, f"the CPU's peak could not be measured: {why}"
