"""``gputop doctor``: what gputop can see on this machine, and for each thing it cannot, why and what to do.

One check per line: NVML and the driver, the versioned NVML calls the driver
has, the GPUs, the container, torch, the per-user socket, the collector the
environment points reporters at, the token and TLS settings, GPUTOP_DISABLE,
and every setting in force with where its value came from.
Each check is wrapped, so one that breaks says so and the others still run.
GPU readings come from the dashboard's own sampler, so doctor sees exactly
what a dashboard started here would.

Nothing here creates a CUDA context: torch is asked only ``is_available()``.

A package by what it checks: ``gpus`` (NVML, the driver, the GPUs), ``machine``
(the container, torch), ``connect`` (the socket, the collector), ``in_force``
(every setting; token, TLS, GPUTOP_DISABLE); ``checks`` is what a check is.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import TextIO

from gputop import __version__
from gputop.collect.gpu.nvml import Nvml
from gputop.collect.gpu.sampler import GpuSampler
from gputop.doctor.checks import (
    COLLECTOR,
    CONTAINER,
    DISABLE,
    DRIVER_CALLS,
    GPUS,
    NVML,
    SETTINGS,
    SOCKET,
    TLS,
    TOKEN,
    TORCH,
    Check,
    as_json,
    guarded,
    render_text,
)
from gputop.doctor.connect import check_collector, check_socket
from gputop.doctor.gpus import check_driver_calls, check_gpus, check_nvml
from gputop.doctor.in_force import check_disable, check_settings, check_tls, check_token
from gputop.doctor.machine import check_container, check_torch


def run(output_format: str = "text", out: TextIO | None = None) -> int:
    """Run every check and print them; 0 when NVML answers with at least one GPU, else 1."""
    stream = out if out is not None else sys.stdout
    checks: list[Check] = []
    if output_format == "text":
        print(f"gputop doctor {__version__}: what gputop can see here", file=stream, flush=True)
    for check in run_checks(os.environ):
        checks.append(check)
        if output_format == "text":  # line by line: importing torch can take seconds
            print("\n".join(render_text(check)), file=stream, flush=True)
    visible = gpus_visible(checks)
    if output_format == "json":
        report = {"gputop": __version__, "gpus_visible": visible, "checks": [as_json(c) for c in checks]}
        print(json.dumps(report, indent=2), file=stream)
    return 0 if visible else 1


def run_checks(env: Mapping[str, str]) -> Iterator[Check]:
    nvml = Nvml()
    sampler = GpuSampler(nvml)
    try:
        yield guarded(NVML, lambda: check_nvml(nvml))
        yield guarded(DRIVER_CALLS, lambda: check_driver_calls(nvml))
        gpus = guarded(GPUS, lambda: check_gpus(sampler))
        yield gpus
    finally:
        sampler.close()
    yield guarded(CONTAINER, lambda: check_container(env))
    yield guarded(TORCH, lambda: check_torch(int(gpus.facts.get("visible", 0))))
    yield guarded(SOCKET, lambda: check_socket(env))
    yield guarded(COLLECTOR, lambda: check_collector(env))
    yield guarded(TOKEN, lambda: check_token(env))
    yield guarded(TLS, lambda: check_tls(env))
    yield guarded(DISABLE, lambda: check_disable(env))
    yield guarded(SETTINGS, lambda: check_settings(env))


def gpus_visible(checks: Sequence[Check]) -> bool:
    return any(c.name == GPUS and c.facts.get("visible", 0) > 0 for c in checks)
