"""The order the integration tier's tests start in.

pytest-xdist hands the workers tests in collection order, so a test that takes half a minute
collected last is half a minute of one worker running while the others have nothing left.  These
modules' tests take 15-50 s each (installs into fresh venvs, hangs held on purpose, jobs on two
hosts, Lightning's and the Trainer's start), much of it waiting on a job: started first, their
waits are filled by the short tests that follow.  Only the order changes; a module missing from
the list runs in its place among the rest.
"""

from __future__ import annotations

import pytest

LONGEST_FIRST = (
    "test_install.py",
    "test_hang_collectives.py",
    "test_multi_host.py",
    "test_lightning_fsdp.py",
    "test_hang_count.py",
    "test_lightning.py",
    "test_gpu_bundle.py",
    "test_trainer_loggers.py",
    "test_trainer_fsdp.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def place(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=place)  # stable: within a module, and among the rest, the order is pytest's
