"""``gputop doctor``: what gputop can see on this machine, and for each thing it cannot, why and what to do.

One check per line: NVML and the driver, the versioned NVML calls the driver
has, the GPUs, the container, torch, the per-user socket, the collector the
environment points reporters at, the token and TLS settings, GPUTOP_DISABLE.
Each check is wrapped, so one that breaks says so and the others still run.
GPU readings come from the dashboard's own sampler, so doctor sees exactly
what a dashboard started here would.

Nothing here creates a CUDA context: torch is asked only ``is_available()``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import socket
import stat
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, TextIO

from gputop import __version__, auth
from gputop.address import LOOPBACK, Address, AddressError, default_socket_path, private_dir_problem, resolve
from gputop.collect.gpu import GpuSampler
from gputop.collect.nvml import NO_DRIVER, NO_LIBRARY, NO_PERMISSION, NO_PYNVML, Nvml, text
from gputop.model.samples import GpuReading

Status = Literal["ok", "note", "problem"]
MARKS: dict[Status, str] = {"ok": "ok", "note": "--", "problem": "!!"}
NAME_WIDTH = 12  # the longest check name, "driver calls", lines the summaries up
CONNECT_TIMEOUT_S = 1.0
MiB = 1 << 20

NVML, DRIVER_CALLS, GPUS, CONTAINER, TORCH = "nvml", "driver calls", "gpus", "container", "torch"
SOCKET, COLLECTOR, TOKEN, TLS, DISABLE = "socket", "collector", "token", "tls", "disable"

PROCESS_CALLS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)
# What gputop does on a driver without each versioned call (the process calls are worked out apart).
FALLBACKS = {
    "nvmlDeviceGetMemoryInfo_v2": "memory read through v1, which counts the driver's reserved memory as used",
    "nvmlDeviceGetTemperatureV": "temperature read through nvmlDeviceGetTemperature",
    "nvmlDeviceGetCurrentClocksEventReasons": "throttle reasons read through nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlGpmQueryDeviceSupport": "no SM and tensor activity (GPM)",
    "nvmlDeviceGetFieldValues": "no PCIe or NVLink throughput",
}
VERSIONED_CALLS = (*PROCESS_CALLS[:2], *FALLBACKS)

# What to do when NVML cannot start, by the reason gputop.collect.nvml gives.
NVML_FIXES = {
    NO_LIBRARY: "install the NVIDIA driver, or in a container start it with the GPUs (docker run --gpus all)",
    NO_DRIVER: "load the NVIDIA driver (nvidia-smi should work), or reboot after installing it",
    NO_PERMISSION: "give this user access to /dev/nvidia* (the video group on some systems)",
    NO_PYNVML: "pip install nvidia-ml-py",
}
CONTAINER_MARKERS = ("docker", "kubepods", "containerd", "libpod", "lxc")


@dataclass(frozen=True)
class Check:
    """One line of the doctor's answer: what was found, and for anything not ok, what to do."""

    name: str
    status: Status
    summary: str
    fix: str = ""
    details: tuple[str, ...] = ()  # further lines: one per GPU, one per missing call
    facts: dict[str, Any] = field(default_factory=dict)  # the same findings as data, for --format json


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


def guarded(name: str, check: Callable[[], Check]) -> Check:
    """The check's answer, or a line saying it broke: one broken check must not hide the others."""
    try:
        return check()
    except Exception as exc:
        return Check(
            name,
            "problem",
            f"this check failed: {type(exc).__name__}: {exc}",
            fix="a bug in gputop doctor: please report it with this output",
        )


def gpus_visible(checks: Sequence[Check]) -> bool:
    return any(c.name == GPUS and c.facts.get("visible", 0) > 0 for c in checks)


# -- output ------------------------------------------------------------------------


def render_text(check: Check) -> list[str]:
    indent = " " * (len("ok  ") + NAME_WIDTH + 2)
    line = f"{MARKS[check.status]}  {check.name:<{NAME_WIDTH}}  {check.summary}"
    if check.fix:
        line += f"; {check.fix}"
    return [line, *(indent + detail for detail in check.details)]


def as_json(check: Check) -> dict[str, Any]:
    return {**asdict(check), "mark": MARKS[check.status], "details": list(check.details)}


# -- NVML and the GPUs -------------------------------------------------------------


def check_nvml(nvml: Nvml) -> Check:
    bindings = _package_version("nvidia-ml-py")
    why = nvml.start()
    if why is not None:
        reason = why.removeprefix("NVML unavailable: ")
        fix = NVML_FIXES.get(reason, "check that nvidia-smi works here")
        return Check(NVML, "problem", why, fix=fix, facts={"error": reason, "nvidia_ml_py": bindings})
    nvml_version = _answer(nvml, "nvmlSystemGetNVMLVersion")
    driver = _answer(nvml, "nvmlSystemGetDriverVersion")
    cuda_code, _ = nvml.call("nvmlSystemGetCudaDriverVersion")
    cuda = cuda_version(cuda_code) if cuda_code is not None else None
    library = loaded_library_path("libnvidia-ml")
    summary = f"NVML {nvml_version or '?'}, driver {driver or '?'}, CUDA {cuda or '?'}, nvidia-ml-py {bindings}"
    facts = {"nvml": nvml_version, "driver": driver, "cuda": cuda, "nvidia_ml_py": bindings, "library": library}
    return Check(NVML, "ok", summary, details=(f"library {library}",) if library else (), facts=facts)


def _answer(nvml: Nvml, fn_name: str) -> str | None:
    value, _ = nvml.call(fn_name)
    return text(value) if value is not None else None


def cuda_version(code: int) -> str:
    """NVML's CUDA version number (12040) as people write it (12.4)."""
    return f"{code // 1000}.{code % 1000 // 10}"


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def loaded_library_path(stem: str) -> str | None:
    """Where this process loaded a shared library from, so a report shows which libnvidia-ml it was."""
    try:
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if Path(path).name.startswith(stem):
                    return path
    except OSError:
        pass
    return None


def check_driver_calls(nvml: Nvml) -> Check:
    """Which versioned calls the loaded libnvidia-ml exports, and how gputop does without the missing ones."""
    if nvml.start() is not None:
        return Check(DRIVER_CALLS, "note", "not checked: NVML unavailable")
    library = nvml.lib.nvmlLib  # the bindings' ctypes CDLL; hasattr looks the symbol up
    present = {name: hasattr(library, name) for name in (*VERSIONED_CALLS, PROCESS_CALLS[2])}
    missing = [name for name in VERSIONED_CALLS if not present[name]]
    process_call = next((name for name in PROCESS_CALLS if present[name]), None)
    facts = {"calls": {name: present[name] for name in VERSIONED_CALLS}, "process_call": process_call}
    if not missing:
        summary = f"all {len(VERSIONED_CALLS)} versioned calls gputop uses are there"
        return Check(DRIVER_CALLS, "ok", summary, facts=facts)
    width = max(len(name) for name in missing)
    details = tuple(f"{name:<{width}}  missing: {without(name, process_call)}" for name in missing)
    summary = f"{len(missing)} of {len(VERSIONED_CALLS)} versioned calls missing (an older driver)"
    if process_call is None:
        return Check(DRIVER_CALLS, "problem", summary, fix="update the NVIDIA driver", details=details, facts=facts)
    fix = "gputop falls back as listed (a newer driver has them all)"
    return Check(DRIVER_CALLS, "note", summary, fix=fix, details=details, facts=facts)


def without(name: str, process_call: str | None) -> str:
    """What gputop does on a driver that lacks ``name``."""
    if name in PROCESS_CALLS:
        if process_call is None:
            return "no process listing at all"
        if process_call == PROCESS_CALLS[0]:
            return f"not needed: {process_call} is used"
        return f"processes listed through {process_call}"
    return FALLBACKS[name]


def check_gpus(sampler: GpuSampler) -> Check:
    sample = sampler.sample()
    if sample.unavailable is not None:
        nvml_down = sample.unavailable.startswith("NVML unavailable")
        if nvml_down:
            return Check(GPUS, "note", "not read: NVML unavailable (see the nvml line)", facts={"visible": 0})
        return Check(
            GPUS,
            "problem",
            sample.unavailable,
            fix="in a container, start it with the GPUs (docker run --gpus all), else check nvidia-smi",
            facts={"visible": 0},
        )
    rows = [_gpu_row(reading) for reading in sample.gpus]
    unreadable = [reading for reading in sample.gpus if "gpu" in reading.na]
    physical = [reading for reading in sample.gpus if reading.mig_parent_uuid is None]
    visible = len(physical) - len(unreadable)
    facts = {"visible": visible, "gpus": [_gpu_facts(reading) for reading in sample.gpus]}
    summary = f"{len(physical)} GPU{'s' if len(physical) != 1 else ''}"
    if unreadable:
        lost = ", ".join(str(reading.index) for reading in unreadable)
        fix = "see nvidia-smi and `dmesg | grep -i xid` for why"
        return Check(GPUS, "problem", f"{summary}, cannot read GPU {lost}", fix=fix, details=tuple(rows), facts=facts)
    return Check(GPUS, "ok", summary, details=tuple(rows), facts=facts)


def _gpu_row(reading: GpuReading) -> str:
    where = f"{reading.index}" if reading.mig_parent_uuid is None else f"{reading.index} MIG"
    if "gpu" in reading.na:
        return f"{where}  {reading.uuid or '?'}  unreadable: {reading.na['gpu']}"
    if reading.mem_total_bytes is not None and reading.mem_used_bytes is not None:
        memory = f"{reading.mem_used_bytes // MiB} MiB / {reading.mem_total_bytes // MiB} MiB used"
    else:
        memory = f"memory N/A: {reading.na.get('mem_used_bytes', 'not read')}"
    return f"{where}  {reading.name}  {reading.uuid}  {memory}"


def _gpu_facts(reading: GpuReading) -> dict[str, Any]:
    return {
        "index": reading.index,
        "name": reading.name,
        "uuid": reading.uuid,
        "mig_parent_uuid": reading.mig_parent_uuid,
        "mem_used_bytes": reading.mem_used_bytes,
        "mem_total_bytes": reading.mem_total_bytes,
        "na": dict(reading.na),
    }


# -- this environment --------------------------------------------------------------


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


# -- where reporters connect -------------------------------------------------------


def check_socket(env: Mapping[str, str]) -> Check:
    """The per-user socket a dashboard listens on by default: its folder's safety, and who listens."""
    path = default_socket_path(env)
    folder = path.parent
    facts: dict[str, Any] = {"path": str(path), "folder_exists": folder.is_dir(), "listening": False}
    if not folder.is_dir():
        return Check(
            SOCKET,
            "note",
            f"{folder} not there yet: no dashboard has run as this user",
            fix="start `gputop`",
            facts=facts,
        )
    info = folder.stat()
    facts.update(folder_mode=f"{stat.S_IMODE(info.st_mode):04o}", folder_uid=info.st_uid)
    problem = private_dir_problem(folder)
    if problem is not None:
        # Reporters refuse such a folder, so nothing reaches a dashboard through it.  A mode problem's
        # message already says to chmod; another user's folder is theirs to remove.
        fix = "" if info.st_uid == os.getuid() else "have it removed, or set XDG_RUNTIME_DIR to a folder of yours"
        return Check(SOCKET, "problem", problem, fix=fix, facts=facts)
    where = f"{path} (folder {facts['folder_mode']}, yours)"
    answer = knock(Address(path=path))
    facts["listening"] = answer.listening
    if answer.listening:
        return Check(SOCKET, "ok", f"a dashboard or recorder is listening at {where}", facts=facts)
    return Check(SOCKET, "note", f"{where}: {answer.why}", fix="start `gputop` to see runs", facts=facts)


def check_collector(env: Mapping[str, str]) -> Check:
    """The collector GPUTOP_ADDR / GPUTOP_PORT / GPUTOP_SOCKET point reporters at, tried as a reporter would."""
    chosen = [name for name in ("GPUTOP_PORT", "GPUTOP_ADDR", "GPUTOP_SOCKET") if env.get(name)]
    if not chosen:
        summary = "GPUTOP_ADDR, GPUTOP_PORT, GPUTOP_SOCKET not set: reporters use the socket above"
        return Check(COLLECTOR, "note", summary, facts={"set": []})
    try:
        address = resolve(env=env)
    except AddressError as exc:
        return Check(COLLECTOR, "problem", str(exc), fix="correct it", facts={"set": chosen})
    # resolve() takes the first of these that is set; say so when several are.
    details = (f"{chosen[0]} wins over {', '.join(chosen[1:])}",) if len(chosen) > 1 else ()
    answer = handshake(address, auth.Security.from_env(env)) if address.is_tcp else knock(address)
    facts = {"set": chosen, "address": str(address), "listening": answer.listening, "error": answer.why}
    if answer.why is None:
        summary = f"{chosen[0]}: a collector is listening at {address}"
        return Check(COLLECTOR, "ok", summary, details=details, facts=facts)
    fix = answer.fix or f"start `gputop {_listen_option(address)}` (or `gputop record`) there"
    summary = f"{chosen[0]}: {address}: {answer.why}"
    return Check(COLLECTOR, "problem", summary, fix=fix, details=details, facts=facts)


def _listen_option(address: Address) -> str:
    if not address.is_tcp:
        return f"--socket {address.path}"
    if address.host == LOOPBACK:
        return f"--port {address.port}"
    return f"--listen :{address.port}"


class Answer(NamedTuple):
    """What a connection attempt found: why it failed (None: it worked), whether anything listens, what to do."""

    why: str | None
    listening: bool
    fix: str = ""


def knock(address: Address) -> Answer:
    """Whether something accepts a connection on the Unix socket; a connect and nothing more."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT_S)
    try:
        sock.connect(str(address.path))
    except FileNotFoundError:
        return Answer("nothing listens (no socket there)", listening=False)
    except ConnectionRefusedError:
        return Answer("nothing listens (a socket file left by one that exited)", listening=False)
    except OSError as exc:
        return Answer(exc.strerror or str(exc), listening=False)
    finally:
        sock.close()
    return Answer(None, listening=True)


def handshake(address: Address, security: auth.Security) -> Answer:
    """Whether a collector at the TCP address admits this environment's token and TLS.

    A reporter's whole handshake, not a bare connect: a token collector counts a
    connection that hangs up at its challenge as a refusal, and only the
    handshake tells whether the token is right.
    """
    assert address.port is not None
    try:
        sock = socket.create_connection((address.host, address.port), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        return Answer(exc.strerror or str(exc) or type(exc).__name__, listening=False)
    try:
        sock, refusal = auth.secure_client(sock, security, address.host, str(address))
    except TimeoutError:
        return Answer("connected, but no gputop greeting within 1 s", True, fix="a TLS collector? set GPUTOP_TLS_CA")
    except auth.HandshakeError as exc:
        return Answer(f"something answers, but not gputop: {exc}", True, fix="check the address")
    except OSError as exc:  # TLS failures are OSErrors too
        return Answer(str(exc) or type(exc).__name__, True, fix="check GPUTOP_TLS_CA against the collector's")
    sock.close()
    if refusal:
        return Answer(refusal.removeprefix(f"{address} "), True, fix="GPUTOP_TOKEN here and the collector's must match")
    return Answer(None, listening=True)


# -- settings ----------------------------------------------------------------------


def check_token(env: Mapping[str, str]) -> Check:
    if auth.Security.from_env(env).token:
        return Check(TOKEN, "ok", "GPUTOP_TOKEN set (not shown)", facts={"set": True})
    return Check(TOKEN, "note", "GPUTOP_TOKEN not set (a collector off loopback demands one)", facts={"set": False})


def check_tls(env: Mapping[str, str]) -> Check:
    names = ("GPUTOP_TLS_CA", "GPUTOP_TLS_CERT", "GPUTOP_TLS_KEY")
    settings = {name: env[name] for name in names if env.get(name)}
    if not settings:
        return Check(TLS, "note", "GPUTOP_TLS_CA, GPUTOP_TLS_CERT, GPUTOP_TLS_KEY not set (plain TCP)", facts={})
    facts: dict[str, Any] = {}
    problems = []
    for name, value in settings.items():
        state = "the system's CAs" if name == "GPUTOP_TLS_CA" and value == "system" else file_state(value)
        facts[name] = {"path": value, "state": state}
        if state not in ("readable", "the system's CAs"):
            problems.append(f"{name}={value}: {state}")
    fix = "point each at a readable PEM file"
    if "GPUTOP_TLS_KEY" in settings and "GPUTOP_TLS_CERT" not in settings:
        problems.append("GPUTOP_TLS_KEY without GPUTOP_TLS_CERT: a listener serves TLS only with a certificate")
        fix = "set GPUTOP_TLS_CERT too" if len(problems) == 1 else fix
    if problems:
        return Check(TLS, "problem", ", ".join(problems), fix=fix, facts=facts)
    summary = ", ".join(f"{name} {facts[name]['state']}" for name in settings)
    return Check(TLS, "ok", summary, facts=facts)


def file_state(path: str) -> str:
    if not os.path.exists(path):
        return "no such file"
    if not os.path.isfile(path):
        return "not a file"
    return "readable" if os.access(path, os.R_OK) else "not readable by this user"


def check_disable(env: Mapping[str, str]) -> Check:
    value = env.get("GPUTOP_DISABLE", "")
    if value in ("", "0"):  # the reporter's own rule (gputop.reporter)
        return Check(DISABLE, "ok", "GPUTOP_DISABLE not set: training reports", facts={"set": False})
    return Check(
        DISABLE,
        "problem",
        f"GPUTOP_DISABLE={value}: every gputop call in training started from here does nothing",
        fix="unset it",
        facts={"set": True, "value": value},
    )
