"""The GPU peak table and MFU's arithmetic (gputop/peaks.py): pure, no torch, no NVML."""

from __future__ import annotations

import re

import pytest

from gputop.peaks import PEAKS, TERA, effective_peak, find_gpu, mfu, normal_name, peak_flops, peak_kind


@pytest.mark.parametrize(
    ("name", "dtype", "tf32", "expected_tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "bfloat16", False, 989.4),
        ("NVIDIA H100 80GB HBM3", "float16", False, 989.4),
        ("NVIDIA H100 80GB HBM3", "float32", True, 494.7),
        ("NVIDIA H100 80GB HBM3", "float32", False, 66.9),
        ("NVIDIA H100 80GB HBM3", "float8_e4m3fn", False, 1978.9),
        ("NVIDIA H100 PCIe", "bfloat16", False, 756.5),
        ("NVIDIA H100 PCIe", "float32", True, 378),
        ("NVIDIA H200", "torch.bfloat16", False, 989.5),
        ("NVIDIA GH200 480GB", "bf16", False, 989.5),
        ("NVIDIA A100-SXM4-80GB", "bfloat16", False, 312),
        ("NVIDIA A100-SXM4-40GB", "float32", True, 156),
        ("NVIDIA A100-PCIE-40GB", "float32", False, 19.5),
        ("NVIDIA A100 80GB PCIe", "bfloat16", False, 312),
        ("NVIDIA L4", "bfloat16", False, 121),
        ("NVIDIA L40S", "float32", True, 183),
        ("NVIDIA A10", "float16", False, 125),
        ("Tesla V100-SXM2-32GB", "float16", False, 125),
        ("Tesla T4", "half", False, 65),
        ("NVIDIA B200", "bfloat16", False, 2250),
    ],
)
def test_each_dtype_reads_its_own_dense_peak(name: str, dtype: str, tf32: bool, expected_tflops: float) -> None:
    peak, what = peak_flops(name, dtype, tf32)
    assert peak == pytest.approx(expected_tflops * TERA)
    assert "dense peak" in what


def test_float32_is_tf32s_peak_only_where_tf32_is_allowed() -> None:
    on, _ = peak_flops("NVIDIA A100-SXM4-80GB", "float32", True)
    off, what = peak_flops("NVIDIA A100-SXM4-80GB", "float32", False)
    assert on == 156 * TERA and off == 19.5 * TERA
    assert what.startswith("FP32 non-tensor dense peak")
    # A part without TF32: float32 matmuls run on its FP32 units whatever the flag says.
    assert peak_flops("Tesla V100-SXM2-16GB", "float32", True)[0] == 15.7 * TERA


def test_a_part_without_that_dtypes_tensor_cores_is_na() -> None:
    assert peak_flops("Tesla V100-SXM2-16GB", "bfloat16", False) == (
        None,
        "Tesla V100-SXM2-16GB has no BF16 tensor cores",
    )
    assert peak_flops("NVIDIA A100-SXM4-80GB", "float8_e5m2", False)[0] is None
    assert peak_flops("NVIDIA A100-SXM4-80GB", "float64", False) == (
        None,
        "no peak known for float64 on NVIDIA A100-SXM4-80GB",
    )


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA A10G",  # AWS's variant of the A10: other tensor peaks
        "NVIDIA H100 94GB HBM2e",  # not the SXM5 board "H100 80GB HBM3" names
        "NVIDIA H100 NVL",
        "NVIDIA H200 NVL",
        "NVIDIA GeForce RTX 4090",
        "NVIDIA A100",
        "GRID A100D-40C",
    ],
)
def test_an_unknown_name_is_na_never_a_neighbours_peak(name: str) -> None:
    assert peak_flops(name, "bfloat16", False) == (None, f"no peak known for {name}")


@pytest.mark.parametrize(
    ("name", "row_name"),
    [
        ("nvidia h100 80gb hbm3", "NVIDIA H100 80GB HBM3"),
        ("  NVIDIA   H100 PCIe ", "NVIDIA H100 PCIe"),
        ("H100-PCIe", "NVIDIA H100 PCIe"),
        ("NVIDIA Tesla V100-SXM2-16GB", "Tesla V100-SXM2-16GB"),
        ("V100 SXM2 32GB", "Tesla V100-SXM2-32GB"),
        ("NVIDIA T4", "Tesla T4"),
        ("NVIDIA A100_SXM4_80GB", "NVIDIA A100-SXM4-80GB"),
        # Memory sizes the table does not list, of parts whose every memory size has the same peaks:
        ("NVIDIA A100-SXM4-64GB", "NVIDIA A100-SXM4-80GB"),
        ("NVIDIA GH200 96GB HBM3", "NVIDIA GH200 480GB"),
    ],
)
def test_nvml_spellings_of_a_listed_part_find_it(name: str, row_name: str) -> None:
    row, why = find_gpu(name)
    assert why == ""
    assert row is not None and row_name in row.names


def test_a_mig_slice_is_na_with_its_reason() -> None:
    peak, why = peak_flops("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "bfloat16", False)
    assert peak is None
    assert why == "NVIDIA A100-SXM4-40GB MIG 1g.5gb is a MIG slice: its share of the GPU's peak is not known"
    assert peak_flops("", "bfloat16", False) == (None, "the GPU's name is not known")


def test_the_table_is_consistent_and_sourced() -> None:
    seen: set[str] = set()
    for row in PEAKS:
        for name in row.names:
            assert normal_name(name) not in seen, name
            seen.add(normal_name(name))
        assert re.search(r"\((19|20)\d\d\)", row.source), row.source  # a document, with its year
        assert row.fp32 > 0
        tensor = [p for p in (row.bf16, row.fp16) if p is not None]
        assert tensor, row.names  # every listed part has FP16 tensor cores at least
        assert all(p > row.fp32 for p in tensor)
        if row.bf16 is not None and row.fp16 is not None:
            assert row.bf16 == row.fp16
        if row.tf32 is not None:
            assert row.fp32 < row.tf32 < min(tensor)
        if row.fp8 is not None:
            assert row.fp8 == pytest.approx(2 * min(tensor), rel=0.02)
    names = {normal_name(n) for row in PEAKS for n in row.names}
    for wanted in (
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H100 PCIe",
        "NVIDIA H200",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA A100-PCIE-40GB",
        "NVIDIA A100 80GB PCIe",
        "NVIDIA L4",
        "NVIDIA L40S",
        "NVIDIA A10",
        "Tesla V100-SXM2-16GB",
        "Tesla V100-SXM2-32GB",
        "Tesla T4",
        "NVIDIA GH200 480GB",
        "NVIDIA B200",
    ):
        assert normal_name(wanted) in names, wanted


def test_peak_kind_names_the_arithmetic() -> None:
    assert peak_kind("torch.bfloat16", False) == "bf16"
    assert peak_kind("float32", True) == "tf32"
    assert peak_kind("fp32", False) == "fp32"
    assert peak_kind("float8_e4m3fn", False) == "fp8"
    assert peak_kind("int8", False) is None


def test_a_mix_of_dtypes_is_weighed_by_the_time_each_takes_at_its_peak() -> None:
    mix = {"bfloat16": 0.5, "float32": 0.25, "float32.conv": 0.25}
    peak, what = effective_peak("NVIDIA A100-SXM4-80GB", mix, tf32_matmul=False, tf32_conv=True)
    expected = 1 / (0.5 / (312 * TERA) + 0.25 / (19.5 * TERA) + 0.25 / (156 * TERA))
    assert peak == pytest.approx(expected)
    assert what == "weighted over 50% bfloat16, 25% float32, 25% float32.conv"
    # One dtype: its own peak.
    assert effective_peak("NVIDIA L4", {"bfloat16": 1.0}, False, False)[0] == pytest.approx(121 * TERA)
    assert effective_peak("Tesla T4", {"bfloat16": 1.0}, False, False) == (None, "Tesla T4 has no BF16 tensor cores")
    assert effective_peak("NVIDIA L4", {}, False, False) == (None, "no counted FLOPs to weigh")


def test_mfu_is_achieved_over_peak() -> None:
    assert mfu(156 * TERA, 312 * TERA) == pytest.approx(0.5)
    assert mfu(None, 312 * TERA) is None
    assert mfu(1.0, None) is None
    assert mfu(1.0, 0.0) is None
    assert mfu(400 * TERA, 312 * TERA) == pytest.approx(400 / 312)  # not clipped: above 1 is a wrong count
