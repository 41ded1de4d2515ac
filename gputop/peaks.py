"""A GPU's dense peak FLOP/s for the dtype a step computes in, from NVIDIA's datasheets: MFU's denominator.

Model FLOPs utilization (docs/mfu.md) is the FLOP/s a rank achieves (its step's counted FLOPs over the step's
time) over the peak its GPU could do in the same arithmetic.  ``PEAKS`` holds the data-centre parts by the name
NVML reports (``nvmlDeviceGetName``), each with its dense (not 2:4-sparse) peaks: BF16 and FP16 on the tensor
cores (FP32 accumulate), TF32 on the tensor cores, FP32 off them, and FP8 where the part has it; and the
datasheet each comes from.  Datasheets print tensor-core figures "with sparsity": the dense figure is half.

A name is matched exactly after normalising what NVML varies (case, spaces and hyphens, an "NVIDIA " or
"Tesla " prefix); a memory size it does not list is tolerated only where every memory size of that part has the
same peaks (A100 SXM4 or PCIe, V100, GH200), never where the memory names the part (an "H100 80GB HBM3" is the
SXM5 board).  A MIG slice, a vGPU profile or any other name is N/A with its reason: no guess.

Pure: no torch, no NVML: the dashboard reads each rank's MFU from it, and a rank its own for its trainer's
loggers (``rank_peak``).  The rank's half (its dtype mix, its TF32 settings, a CPU's measured peak) is
``gputop.reporter.flops``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

TERA = 1e12


@dataclass(frozen=True)
class GpuPeaks:
    """One part's dense peaks in FLOP/s; None where it has no tensor cores for that dtype."""

    names: tuple[str, ...]  # as nvmlDeviceGetName reports them
    bf16: float | None
    fp16: float | None
    tf32: float | None
    fp32: float  # off the tensor cores
    fp8: float | None
    source: str  # the vendor document, and its year
    unconfirmed: str = ""  # which figures were not checked against the document when the table was written
    memory_variants: bool = False  # another memory size of this part has the same peaks


def _hopper(names: tuple[str, ...], source: str, unconfirmed: str = "", memory_variants: bool = False) -> GpuPeaks:
    """The H100 SXM5's compute, which the H200 and GH200 share: 1,979 / 989 TFLOPS (BF16 / TF32) with sparsity,
    67 FP32, 3,958 FP8 with sparsity."""
    return GpuPeaks(
        names, 989.5 * TERA, 989.5 * TERA, 494.5 * TERA, 67 * TERA, 1979 * TERA, source, unconfirmed, memory_variants
    )


def _a100(names: tuple[str, ...], source: str) -> GpuPeaks:
    return GpuPeaks(names, 312 * TERA, 312 * TERA, 156 * TERA, 19.5 * TERA, None, source, memory_variants=True)


PEAKS: tuple[GpuPeaks, ...] = (
    GpuPeaks(
        ("NVIDIA H100 80GB HBM3",),  # the SXM5 board
        989.4 * TERA,
        989.4 * TERA,
        494.7 * TERA,
        66.9 * TERA,
        1978.9 * TERA,
        "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022), H100 SXM5 column; the datasheet (2023) rounds "
        "to 1,979 / 989 / 67 / 3,958 TFLOPS with sparsity",
    ),
    GpuPeaks(
        ("NVIDIA H100 PCIe",),
        756.5 * TERA,
        756.5 * TERA,
        378 * TERA,
        51 * TERA,
        1513 * TERA,
        "NVIDIA H100 Tensor Core GPU datasheet (2023), H100 PCIe: 1,513 / 756 / 51 / 3,026 TFLOPS with sparsity",
    ),
    _hopper(("NVIDIA H200",), "NVIDIA H200 Tensor Core GPU datasheet (2024), H200 SXM: the H100 SXM's compute"),
    _hopper(
        ("NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e"),
        "NVIDIA GH200 Grace Hopper Superchip datasheet (2023), its Hopper GPU: the H100 SXM's compute",
        unconfirmed="all (taken as the H100 SXM's, as the datasheet states; not checked against it here)",
        memory_variants=True,
    ),
    _a100(
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM-80GB"),
        "NVIDIA A100 Tensor Core GPU datasheet (2021): 312 / 156 / 19.5 TFLOPS (BF16 / TF32 / FP32), SXM and PCIe",
    ),
    _a100(
        ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"),
        "NVIDIA A100 Tensor Core GPU datasheet (2021): 312 / 156 / 19.5 TFLOPS (BF16 / TF32 / FP32), SXM and PCIe",
    ),
    GpuPeaks(
        ("NVIDIA L4",),
        121 * TERA,
        121 * TERA,
        60 * TERA,
        30.3 * TERA,
        242.5 * TERA,
        "NVIDIA L4 Tensor Core GPU datasheet (2023): 242 / 120 / 30.3 / 485 TFLOPS with sparsity",
        unconfirmed="FP32 30.3 and BF16 242 (with sparsity) seen only in third-party copies of the datasheet",
    ),
    GpuPeaks(
        ("NVIDIA L40S",),
        362.05 * TERA,
        362.05 * TERA,
        183 * TERA,
        91.6 * TERA,
        733 * TERA,
        "NVIDIA L40S GPU datasheet (2023): 362.05 | 733 BF16, 183 | 366 TF32, 91.6 FP32, 733 | 1,466 FP8 "
        "(dense | with sparsity)",
    ),
    GpuPeaks(
        ("NVIDIA A10",),  # not the A10G (AWS), whose tensor peaks are lower: a different name, N/A
        125 * TERA,
        125 * TERA,
        62.5 * TERA,
        31.2 * TERA,
        None,
        "NVIDIA A10 Tensor Core GPU datasheet (2021): 125 | 250 BF16, 62.5 | 125 TF32, 31.2 FP32",
        unconfirmed="tensor-core figures (the FP32 31.2 matches third-party pages; the rest is from the datasheet "
        "as remembered, not found by the search here)",
    ),
    GpuPeaks(
        ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"),
        None,
        125 * TERA,
        None,
        15.7 * TERA,
        None,
        "NVIDIA Tesla V100 GPU Accelerator datasheet (2018), SXM2: 125 tensor TFLOPS (FP16), 15.7 FP32",
        memory_variants=True,
    ),
    GpuPeaks(
        ("Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"),
        None,
        112 * TERA,
        None,
        14 * TERA,
        None,
        "NVIDIA Tesla V100 GPU Accelerator datasheet (2018), PCIe: 112 tensor TFLOPS (FP16), 14 FP32",
        unconfirmed="both (the search found only the pre-launch 120 / 15 at a lower clock)",
        memory_variants=True,
    ),
    GpuPeaks(
        ("Tesla T4",),
        None,
        65 * TERA,
        None,
        8.1 * TERA,
        None,
        "NVIDIA T4 Tensor Core GPU datasheet (2019): 65 TFLOPS mixed FP16/FP32, 8.1 FP32",
    ),
    GpuPeaks(
        ("NVIDIA B200",),
        2250 * TERA,
        2250 * TERA,
        1100 * TERA,
        75 * TERA,
        4500 * TERA,
        "NVIDIA HGX B200 datasheet (2024), per GPU at 1,000 W: 4.5 / 2.2 PFLOPS BF16 / TF32 and 9 PFLOPS FP8 with "
        "sparsity, 75 TFLOPS FP32",
        unconfirmed="a B200 configured below 1,000 W peaks lower (the table assumes HGX B200's setting)",
    ),
)

_MEMORY = re.compile(r"^(\d+gb?|hbm\w*)$")


def normal_name(name: str) -> str:
    """A device name as the table compares it: lower case, hyphens and underscores as spaces, single spaces,
    without a leading "NVIDIA " or "Tesla "."""
    text = " ".join(name.replace("-", " ").replace("_", " ").split()).casefold()
    for prefix in ("nvidia ", "tesla "):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text


def _family(normal: str) -> str:
    return " ".join(word for word in normal.split() if not _MEMORY.match(word))


_BY_NAME = {normal_name(name): row for row in PEAKS for name in row.names}
_BY_FAMILY: dict[str, GpuPeaks] = {}
for _row in PEAKS:
    if _row.memory_variants:
        for _name in _row.names:
            _BY_FAMILY[_family(normal_name(_name))] = _row


def find_gpu(nvml_name: str) -> tuple[GpuPeaks | None, str]:
    """The table's row for a device name, or None and why."""
    normal = normal_name(nvml_name or "")
    if not normal:
        return None, "the GPU's name is not known"
    if "mig" in normal.split():
        return None, f"{nvml_name.strip()} is a MIG slice: its share of the GPU's peak is not known"
    row = _BY_NAME.get(normal) or _BY_FAMILY.get(_family(normal))
    if row is None:
        return None, f"no peak known for {nvml_name.strip()}"
    return row, ""


def peak_kind(dtype: str, tf32_enabled: bool) -> str | None:
    """Which of a row's peaks a dtype computes at: "bf16", "fp16", "tf32", "fp32", "fp8"; None: none listed.

    ``dtype`` as torch names it ("bfloat16", "torch.float16", "float32") or short ("bf16", "fp32");
    float32 is "tf32" where TF32 is allowed for it (``gputop.reporter.device_peak.tf32_modes``).
    """
    text = dtype.casefold().removeprefix("torch.")
    if text in ("bfloat16", "bf16"):
        return "bf16"
    if text in ("float16", "half", "fp16"):
        return "fp16"
    if text in ("float32", "float", "fp32", "tf32"):
        return "tf32" if tf32_enabled or text == "tf32" else "fp32"
    if text.startswith("float8") or text == "fp8":
        return "fp8"
    return None


def peak_flops(nvml_name: str, dtype: str, tf32_enabled: bool) -> tuple[float | None, str]:
    """The device's dense peak FLOP/s for ``dtype`` and what it is ("bf16 tensor-core peak, <datasheet>"), or
    None and why: bfloat16 and float16 at the tensor cores' peak; float32 at TF32's where ``tf32_enabled`` and
    the part has TF32 (else, as the matmuls then run, at FP32's); an unknown name "no peak known for <name>".
    """
    row, why = find_gpu(nvml_name)
    if row is None:
        return None, why
    kind = peak_kind(dtype, tf32_enabled)
    if kind is None:
        return None, f"no peak known for {dtype} on {nvml_name.strip()}"
    if kind == "tf32" and row.tf32 is None:
        kind = "fp32"  # no TF32 on this part: float32 matmuls run on the FP32 units
    peak = getattr(row, kind)
    if peak is None:
        return None, f"{nvml_name.strip()} has no {kind.upper()} tensor cores"
    where = "tensor-core" if kind != "fp32" else "non-tensor"
    return float(peak), f"{kind.upper()} {where} dense peak: {row.source}"


def effective_peak(
    nvml_name: str, mix: Mapping[str, float], tf32_matmul: bool, tf32_conv: bool
) -> tuple[float | None, str]:
    """The peak for a step whose counted FLOPs are spread over dtypes (``FlopCounter.mix()``: share by dtype,
    "float32.conv" for float32 convolutions, which TF32 speeds under cuDNN's flag): the FLOP/s at which the
    step's work would take the time it takes at each dtype's own peak, 1 / sum(share / peak)."""
    if not mix:
        return None, "no counted FLOPs to weigh"
    seconds_per_flop = 0.0
    described = []
    for dtype, share in sorted(mix.items(), key=lambda item: -item[1]):
        base, _, part = dtype.partition(".")
        peak, why = peak_flops(nvml_name, base, tf32_conv if part == "conv" else tf32_matmul)
        if peak is None:
            return None, why
        seconds_per_flop += share / peak
        described.append(f"{share:.0%} {dtype}")
    total = sum(mix.values())
    return total / seconds_per_flop, f"weighted over {', '.join(described)}"


def mfu(achieved_flops_per_s: float | None, peak: float | None) -> float | None:
    """Model FLOPs utilization: achieved over peak, as a fraction (None where either is unknown).  Not clipped:
    above 1 means the count or the peak is wrong (a peak for the wrong dtype, recomputation counted)."""
    if achieved_flops_per_s is None or peak is None or peak <= 0:
        return None
    return achieved_flops_per_s / peak


def rank_peak(
    on_cuda: bool,
    gpu_name: str | None,
    mix: Mapping[str, float] | None,
    tf32_matmul: bool,
    tf32_conv: bool,
    cpu_peak_flops: float | None,
    cpu_peak_cost_s: float | None = None,
) -> tuple[float | None, str]:
    """The FLOP/s a rank's device could do for its step's mix of dtypes, and what it is (or why it is N/A).

    A GPU's dense peak from its datasheet, by the name NVML (else torch) gives it; a CPU's, the fp32 matmul the
    rank measured once on its own threads (docs/mfu.md).
    """
    if on_cuda:
        if not gpu_name:
            return None, "the rank's GPU model is not known"
        return effective_peak(gpu_name, mix or {}, tf32_matmul, tf32_conv)
    if cpu_peak_flops:
        cost = f", measuring it took {cpu_peak_cost_s * 1e3:.0f} ms" if cpu_peak_cost_s else ""
        return cpu_peak_flops, f"an fp32 matmul on the rank's own threads{cost}"
    return None, "the rank has not measured its CPU's matmul peak yet (it does so in its first counted step)"
