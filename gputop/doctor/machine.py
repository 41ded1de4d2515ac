"""This environment: the container gputop runs in, and torch (asked only ``is_available()``: no CUDA context)."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from collections.abc import Mapping
from pathlib import Path

from gputop.doctor.checks import (
    CONTAINER,
    TORCH,
    Check,
)

CONTAINER_MARKERS = ("docker", "kubepods", "containerd", "libpod", "lxc")


def check_container(env: Mapping[str, str]) -> Check:
    signs = container_signs(env)
    if not signs:
        return Check(CONTAINER, "ok", "not a container: NVML's PIDs are this machine's", facts={"container": False})
    init = _read_first_line("/proc/1/comm")
    # From inside, a private PID namespace is told by PID 1: the host's init only when it shares the host's.
    own_namespace = init not in ("systemd", "init")
    facts = {"container": True, "signs": signs, "pid1": init, "own_pid_namespace": own_namespace}
    found = ", ".join(signs)
    if not own_namespace:
        return Check(CONTAINER, "ok", f"container ({found}) sharing the host's PID namespace", facts=facts)
    summary = f"container ({found}), own PID namespace: NVML gives host PIDs, so gputop pairs ranks and GPUs by UUID"
    return Check(CONTAINER, "note", summary, facts=facts)


def container_signs(env: Mapping[str, str]) -> list[str]:
    signs = [path for path in ("/.dockerenv", "/run/.containerenv") if os.path.exists(path)]
    try:
        cgroup = Path("/proc/1/cgroup").read_text(errors="replace")
    except OSError:
        cgroup = ""
    signs += [f"/proc/1/cgroup names {marker}" for marker in CONTAINER_MARKERS if marker in cgroup]
    if env.get("KUBERNETES_SERVICE_HOST"):
        signs.append("KUBERNETES_SERVICE_HOST")
    return signs


def _read_first_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().strip()
    except OSError:
        return "?"


def check_torch(visible_gpus: int) -> Check:
    try:
        # Imported by name: the dashboard side never needs torch, and doctor only inspects it.
        torch = importlib.import_module("torch")
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            return Check(TORCH, "problem", f"torch fails to import: {exc}", fix="reinstall torch in this environment")
        return Check(
            TORCH, "note", "torch not installed here (only training environments need it)", facts={"installed": False}
        )
    except Exception as exc:  # a broken install: a missing shared library, an ABI mismatch
        return Check(
            TORCH,
            "problem",
            f"torch fails to import: {type(exc).__name__}: {exc}",
            fix="reinstall torch in this environment",
        )
    built_for = torch.version.cuda
    # is_available() asks the driver for a device count; it creates no CUDA context.
    available = bool(torch.cuda.is_available())
    facts = {"installed": True, "version": torch.__version__, "cuda": built_for, "cuda_available": available}
    build = f"CUDA {built_for}" if built_for else "a CPU-only build"
    summary = f"torch {torch.__version__}, {build}, torch.cuda.is_available() {available}"
    if visible_gpus and not available:
        if not built_for:
            fix = "install a CUDA build of torch to train on these GPUs (pytorch.org/get-started)"
        else:
            fix = "check CUDA_VISIBLE_DEVICES and that the driver's CUDA is at least torch's"
        return Check(TORCH, "problem", f"{summary} while NVML sees {visible_gpus} GPU(s)", fix=fix, facts=facts)
    return Check(TORCH, "ok", summary, facts=facts)
