"""A ``pynvml`` module for processes a test starts: the fake NVML (tests/fake_nvml.py) under pynvml's name.

Put this folder first on ``PYTHONPATH`` and ``import pynvml`` finds it before
nvidia-ml-py, the way the real one is found, so a node sampler started by a
rank in a test reads GPUs that exist only in ``FAKE_NVML_GPUS``: a JSON list
of ``{"uuid": ..., "util_pct": ..., "processes": [pid, ...]}``.  Nothing in
gputop knows it is a fake.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for tests.fake_nvml

from tests.fake_nvml import FakeGpu, FakeNvml, FakeProcess


def _backend() -> FakeNvml:
    gpus = []
    for spec in json.loads(os.environ.get("FAKE_NVML_GPUS", "[]")):
        processes = [FakeProcess(pid=int(pid)) for pid in spec.pop("processes", [])]
        gpus.append(FakeGpu(**spec, processes=processes))
    return FakeNvml(gpus)


_BACKEND = _backend()


def __getattr__(name: str) -> Any:
    return getattr(_BACKEND, name)
