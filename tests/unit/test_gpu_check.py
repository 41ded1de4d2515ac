"""`make gpu-check` on a machine without a GPU, and the pure pieces its checks stand on.

The checks themselves need a GPU (docs/gpu.md has the table from a real run
when one was lent); here: the check list, the
parsing of nvidia-smi's CSV, the tolerance test, the table, and a broken check
becoming a row instead of ending the run.  The one-line refusal and exit 2 of the
real script, which imports torch, is in tests/integration/test_gpu_check.py.
"""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from tests.support.gpu_check import ROOT, SCRIPT, gpu_check

MIB = 2**20


def test_make_gpu_check_runs_the_script() -> None:
    dry = subprocess.run(["make", "-n", "gpu-check"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "benchmarks/gpu_check.py" in dry.stdout


def test_the_checks_are_listed() -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert [line.split()[0] for line in result.stdout.splitlines()] == list(gpu_check.CHECKS)


def test_nvidia_smi_csv_with_unsupported_fields() -> None:
    text = (
        "GPU-11111111-2222-3333-4444-555555555555, 0, 97, 40536, 612.34, 61\n"
        "GPU-66666666-7777-8888-9999-000000000000, 1, [N/A], 3, [Not Supported], 38\n"
    )
    first, second = gpu_check.parse_smi_csv(text)
    assert first.uuid.startswith("GPU-1111") and first.index == 0 and first.util_pct == 97.0
    assert first.mem_used_bytes == 40536 * 2**20 and first.power_w == pytest.approx(612.34)
    assert second.util_pct is None and second.power_w is None and second.temp_c == 38.0


def test_tolerances() -> None:
    assert gpu_check.within(102.0, 100.0, rel=0.02)
    assert not gpu_check.within(103.0, 100.0, rel=0.02)
    assert gpu_check.within(105.0, 100.0, abs_=5.0)
    assert not gpu_check.within(None, 100.0, abs_=1e9)  # a missing reading never agrees


def test_the_table_survives_odd_messages() -> None:
    rows = [gpu_check.Row("a|b", "x", "line one\nline two", "error: KeyError: '|'")]
    table = gpu_check.markdown_table(rows).splitlines()
    assert table[2] == "| a\\|b | x | line one line two | error: KeyError: '\\|' |"


def test_a_check_that_breaks_is_a_row_and_the_run_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> list[object]:  # gpu_check.Row: the script is loaded from its file, untyped
        raise RuntimeError("no nvidia-smi in this container")

    monkeypatch.setitem(gpu_check.CHECKS, "nvml", gpu_check.Check(broken, 1))
    (row,) = gpu_check.run_check("nvml")
    assert row.result == "error: RuntimeError: no nvidia-smi in this container" and not row.passed


def test_the_cuda_rows_run_first_and_every_one_fits_the_device_calls_budget() -> None:
    """The CUDA path's rows are the code no other machine runs: a budget that ends the call drops the others."""
    names = list(gpu_check.CHECKS)
    assert names[: len(gpu_check.CUDA_ROWS)] == list(gpu_check.CUDA_ROWS)
    device = (ROOT / "scripts" / "gpu-device").read_text()
    budget_s = float(device.split("budget_s=${GPU_BUDGET_S:-", 1)[1].split("}", 1)[0])
    cuda_s = sum(gpu_check.CHECKS[name].estimate_s for name in gpu_check.CUDA_ROWS)
    assert cuda_s <= budget_s, (cuda_s, budget_s)


def test_the_exposed_wait_row_fails_where_no_wait_was_measured() -> None:
    """A job whose ``watch()`` returned None measures 0 against 0: that is no agreement."""
    assert gpu_check.exposed_wait_agrees(20.6, 20.1)
    assert not gpu_check.exposed_wait_agrees(0.0, 0.0)  # nothing timed, no delay either
    assert not gpu_check.exposed_wait_agrees(0.0, 20.1)  # the wait went unread
    assert not gpu_check.exposed_wait_agrees(None, 20.1)
    assert not gpu_check.exposed_wait_agrees(30.0, 20.1)


def test_the_mfu_row_fails_on_a_peak_for_another_dtype_than_the_job_ran() -> None:
    """gputop's MFU and the profiler's share the peak: a float32 peak for a bf16 job would agree with itself."""
    assert gpu_check.mfu_agrees(41.0, 40.0, "weighted over 100% bfloat16")
    assert not gpu_check.mfu_agrees(41.0, 40.0, "weighted over 100% float32")
    assert not gpu_check.mfu_agrees(41.0, 40.0, "weighted over 60% float32, 40% bfloat16")
    assert not gpu_check.mfu_agrees(60.0, 40.0, "weighted over 100% bfloat16")
    assert not gpu_check.mfu_agrees(None, 40.0, "weighted over 100% bfloat16")


def test_a_timed_out_job_ends_with_everything_it_started(tmp_path) -> None:
    """A timed-out torchrun's worker went on training into the next row's measurements."""
    import time

    marker = tmp_path / "grandchild"
    code = (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); open({str(marker)!r}, 'w')"
        ".write(str(p.pid)); time.sleep(60)"
    )
    with pytest.raises(subprocess.TimeoutExpired):
        gpu_check.run_tree([sys.executable, "-c", code], timeout_s=3)
    grandchild = int(marker.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(grandchild):
        time.sleep(0.05)
    assert not _alive(grandchild), f"pid {grandchild} outlived its job's timeout"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_the_phase_rows_fail_where_either_side_measured_nothing() -> None:
    assert gpu_check.phase_agrees(10.4, 10.0)
    assert not gpu_check.phase_agrees(0.0, 0.0)  # no kernel seen, no phase read: no agreement
    assert not gpu_check.phase_agrees(None, 10.0)  # no window on the GPU clock
    assert not gpu_check.phase_agrees(12.0, 10.0)


def test_the_in_flight_row_fails_on_a_synchronize_added_or_nccls_durations_refused() -> None:
    assert gpu_check.in_flight_agrees(0.31, 0.30, syncs=0, refused=False)
    assert not gpu_check.in_flight_agrees(0.31, 0.30, syncs=1, refused=False)  # a sync by another thread
    assert not gpu_check.in_flight_agrees(0.31, 0.30, syncs=0, refused=True)
    assert not gpu_check.in_flight_agrees(None, 0.30, syncs=0, refused=False)
    assert not gpu_check.in_flight_agrees(0.0, 0.0, syncs=0, refused=False)


# Each row of the GPU check fails on the defect it exists to catch: a planted one each, against its predicate.


def test_the_nvml_rows_fail_on_a_reading_off_by_more_than_its_tolerance_in_most_pairs() -> None:
    reading = "GPU-1, 0, 90, 1000, 300.0, 60\n"
    (smi,) = gpu_check.parse_smi_csv(reading)
    gputop = types.SimpleNamespace(mem_used_bytes=smi.mem_used_bytes, util_pct=88.0, power_w=305.0, temp_c=61.0)
    off = types.SimpleNamespace(mem_used_bytes=smi.mem_used_bytes + 200 * MIB, util_pct=40.0, power_w=200.0,
                                temp_c=70.0)  # fmt: skip
    for name, _, agrees, _ in gpu_check.NVML_TOLERANCES:
        assert agrees(gputop, smi), name
        assert not agrees(off, smi), name  # memory in the wrong unit, utilization of another GPU, ...
    assert gpu_check.mostly_agree(8, 10) and not gpu_check.mostly_agree(7, 10)
    assert not gpu_check.mostly_agree(0, 0)  # no GPU in common: nothing agreed


def test_the_nvml_process_and_link_rows_fail_on_a_missing_process_or_an_unexplained_na() -> None:
    assert gpu_check.process_agrees([300 * MIB], [310 * MIB])
    assert not gpu_check.process_agrees([], [310 * MIB])  # the versioned call listed nothing
    assert not gpu_check.process_agrees([300 * MIB, 300 * MIB], [310 * MIB])  # listed on two GPUs
    assert not gpu_check.process_agrees([None], [310 * MIB])
    assert gpu_check.pcie_plausible(12e9)
    assert not gpu_check.pcie_plausible(12e6)  # KB/s read as B/s: a unit slip
    assert not gpu_check.pcie_plausible(None)
    assert gpu_check.nvlink_plausible(None, None, "no NVLink on this GPU")
    assert not gpu_check.nvlink_plausible(None, None, None)  # N/A without its reason
    assert not gpu_check.nvlink_plausible(5e12, 1e9, None)  # a counter not differenced
    assert gpu_check.sample_fast(0.004) and not gpu_check.sample_fast(0.2)  # a blocking bus call


def test_the_join_row_fails_on_the_rank_put_on_another_gpu_or_on_two() -> None:
    assert gpu_check.join_agrees(["GPU-aa"], "GPU-aa", "GPU-aa")
    assert not gpu_check.join_agrees(["GPU-bb"], "GPU-bb", "GPU-aa")  # CUDA_VISIBLE_DEVICES' index taken as NVML's
    assert not gpu_check.join_agrees(["GPU-aa", "GPU-bb"], "GPU-aa", "GPU-aa")  # joined to two
    assert not gpu_check.join_agrees(["GPU-aa"], None, "GPU-aa")  # the rank never said


def test_the_step_time_and_rules_rows_fail_on_a_ratio_out_of_band_or_a_finding_on_the_wrong_job() -> None:
    assert gpu_check.step_time_agrees(0.97, (0.8, 1.2), fired=False, wants_parallelism=False)
    assert not gpu_check.step_time_agrees(0.4, (0.8, 1.2), fired=False, wants_parallelism=False)  # host time read
    assert not gpu_check.step_time_agrees(0.97, (0.8, 1.2), fired=True, wants_parallelism=False)
    assert not gpu_check.step_time_agrees(None, (0.0, 0.5), fired=True, wants_parallelism=True)
    report = {"findings": [{"cause": "memory", "severity": "info"}, {"cause": "data_loading", "severity": "warn"}]}
    assert gpu_check.causes(report) == {"data_loading"}  # "the batch could grow" (info) is no memory finding
    assert gpu_check.loader_row_agrees({"data_loading"}, [22.0])
    assert not gpu_check.loader_row_agrees({"data_loading"}, [93.0])  # the GPU was busy after all
    assert not gpu_check.loader_row_agrees({"data_loading"}, [])  # no GPU joined to the rank
    assert not gpu_check.loader_row_agrees(set(), [22.0])


def test_the_context_row_fails_on_a_second_context_or_one_on_another_gpu() -> None:
    smi = gpu_check.parse_smi_csv("GPU-aa, 0, 0, 0, 0, 30\nGPU-bb, 1, 0, 0, 0, 30\n")
    assert gpu_check.one_context_on({7: {"GPU-aa": 500 * MIB}}, smi[0], smi)[0] == "pass"
    assert gpu_check.one_context_on({7: {"GPU-aa": 500 * MIB, "GPU-bb": 300 * MIB}}, smi[0], smi)[0] == "fail"
    assert gpu_check.one_context_on({7: {"GPU-bb": 500 * MIB}}, smi[0], smi)[0] == "fail"
    assert gpu_check.one_context_on({}, smi[0], smi)[0].startswith("error")


def test_the_ddp_overhead_and_fsdp2_rows_fail_on_a_zero_a_slowdown_or_an_untimed_collective() -> None:
    assert gpu_check.ddp_window_measured(0.01, 0.02, 0.005)
    assert not gpu_check.ddp_window_measured(0.01, 0.0, 0.005)  # a timer never read
    assert gpu_check.ddp_timings_agree(12, 0, [])
    assert not gpu_check.ddp_timings_agree(12, 1, [])
    assert not gpu_check.ddp_timings_agree(12, 0, ["ddp_stats: no timings"])
    assert not gpu_check.ddp_timings_agree(1, 0, [])
    assert gpu_check.overhead_agrees([98.0, 99.0, 97.5], [100.0, 99.0, 100.5])
    assert not gpu_check.overhead_agrees([90.0, 91.0, 92.0], [100.0, 99.0, 100.5])  # a sync every tenth forward
    assert gpu_check.cuda_phases_read({"phases_from": "cuda events", "forward_ms": 3.1, "backward_ms": 6.0})
    assert not gpu_check.cuda_phases_read({"phases_from": "host clock", "forward_ms": 3.1, "backward_ms": 6.0})
    timed = {"calls_per_step": 1, "bytes_per_step": 4, "in_flight_ms": 0.2, "exposed_ms": 0.1}
    assert gpu_check.collective_timed(timed)
    assert not gpu_check.collective_timed({**timed, "in_flight_ms": None})  # counted, never timed
    assert not gpu_check.collective_timed({**timed, "bytes_per_step": 0})
    assert not gpu_check.collective_timed(None)
