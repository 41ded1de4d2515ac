"""Which integration tests may run beside another: `make test` runs these two at a time, the rest alone.

A test here checks plumbing (what arrives, what is installed, what is left
behind, what a command prints), which holds however slowly its job runs.  Every
other integration test asserts a verdict or a share of time measured on two
cores, which another job beside it would change (gputop would rightly name
that job as sharing the CPUs): those run one at a time, after these.  A new
file runs alone until it is added here.
"""

from __future__ import annotations

import pytest

SIDE_BY_SIDE = frozenset(
    {
        "test_capture", "test_cli", "test_collective_tap", "test_compile_probe", "test_data_parallel",
        "test_ddp_integration", "test_ddp_zeros", "test_doctor", "test_gpu_bundle", "test_gpu_check",
        "test_install", "test_job_ids", "test_lightning", "test_lightning_callback", "test_lightning_fsdp",
        "test_multi_host", "test_prometheus", "test_recording", "test_remote_auth", "test_reporter",
        "test_reporter_hooks", "test_terminal_gone", "test_trainer_fsdp",
    }
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in SIDE_BY_SIDE:
            item.add_marker(pytest.mark.side_by_side)
