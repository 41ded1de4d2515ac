"""A stand-in ``libnvidia-ml.so.1`` for tests: the real ``pynvml`` over a scenario file.

The C library next to this file (``libnvidia-ml.c``) exports the NVML functions
gputop's collectors call, with NVIDIA's struct layouts, and answers from a
scenario file named by ``GPUTOP_NVML_STANDIN``.  This module builds it, writes
scenarios and hands it to ``pynvml``:

    folder = build()                                  # cached per (source, omit, defines)
    Scenario([Gpu(uuid="GPU-...")]).write(path)       # atomically; a rewrite is noticed
    pynvml = use_in_process(monkeypatch, path)        # this process, for one test
    env = {**os.environ, **env_for(path)}             # a subprocess (LD_LIBRARY_PATH)

``DRIVERS`` names driver generations as builds: ``"current"``, ``"no_v3"`` (an
R470-era library without the ``_v3`` process calls, ``_v2`` memory info, GPM
...), ``"r535_early"`` (``_v3`` process calls writing 32-byte entries).

Scenario file format (one fact a line, ``#`` comments, ``"quoted"`` names)::

    driver 550.54.15
    cuda 12040
    init_error 0
    gpu 0 uuid GPU-...
    gpu 0 name NVIDIA H100 80GB HBM3
    gpu 0 util GPU_PCT MEM_PCT
    gpu 0 memory TOTAL RESERVED USED          # bytes
    gpu 0 power MW LIMIT_MW
    gpu 0 temp C
    gpu 0 clocks SM_MHZ MEM_MHZ
    gpu 0 pcie_kib_s RX TX
    gpu 0 pcie_delay_ms MS
    gpu 0 pcie_bytes RX TX                     # cumulative, fields 198 / 197
    gpu 0 pcie_counters_unsupported 1
    gpu 0 nvlink LINKS RX_KIB TX_KIB           # cumulative, fields 139 / 138, 91
    gpu 0 clock_events 0x4
    gpu 0 ecc N
    gpu 0 process PID BYTES|-                  # repeatable
    gpu 0 graphics_process PID BYTES|-         # repeatable
    gpu 0 util_sample PID TIMESTAMP_US SM MEM  # repeatable
    gpu 0 unsupported nvmlFunctionName         # repeatable; NOT_SUPPORTED (also its _vN / V forms)
    gpu 0 no_permission nvmlFunctionName       # repeatable; NO_PERMISSION (likewise)
    gpu 0 lost 1
    gpu 0 gpm SM_PCT TENSOR_PCT
    gpu 0 mig 1
    gpu 0 mig_instance SLOT UUID "NAME" TOTAL USED
    gpu 0 mig_process SLOT PID BYTES|-
    gpu 0 cc MAJOR MINOR
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "libnvidia-ml.c"
REPO = HERE.parents[2]
CACHE = REPO / ".bench" / "nvml-standin"  # .bench/ is git-ignored
LIBRARY = "libnvidia-ml.so.1"
ENV_VAR = "GPUTOP_NVML_STANDIN"

MiB = 1 << 20


# ---- building -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Driver:
    """A driver generation, as a build of the stand-in: symbols left out and C defines."""

    omit: frozenset[str] = frozenset()
    defines: tuple[str, ...] = ()
    version: str = "550.54.15"  # what nvmlSystemGetDriverVersion says, via for_driver()
    pcie_counters: bool = True  # whether fields 197/198 (PCIe byte counters) answer


DRIVERS: dict[str, Driver] = {
    # Everything pynvml 13.615.71 reaches for.  550.54.15 with CUDA 12.4 is the driver of the
    # 8x H100 SXM server in NVIDIA/nccl issue #1264.
    "current": Driver(),
    # An R470-era library: before the _v3 process calls (added with R510, per nvitop PR #79),
    # before nvmlDeviceGetMemoryInfo_v2 (present in 510.39.01, NVIDIA/nvidia-settings issue #78),
    # and before GPM, nvmlDeviceGetTemperatureV and the ClocksEventReasons rename.  It has
    # nvmlDeviceGetComputeRunningProcesses_v2 and the unversioned (v1) call.  Its missing PCIe
    # byte counters are a scenario flag (nvmlDeviceGetFieldValues exists; fields 197/198 answer
    # NOT_SUPPORTED), which for_driver() sets.  The version string is illustrative.
    "no_v3": Driver(
        omit=frozenset(
            {
                "nvmlDeviceGetComputeRunningProcesses_v3",
                "nvmlDeviceGetGraphicsRunningProcesses_v3",
                "nvmlDeviceGetMemoryInfo_v2",
                "nvmlDeviceGetTemperatureV",
                "nvmlDeviceGetCurrentClocksEventReasons",
                "nvmlGpmQueryDeviceSupport",
                "nvmlGpmSampleAlloc",
                "nvmlGpmSampleFree",
                "nvmlGpmSampleGet",
                "nvmlGpmMetricsGet",
            }
        ),
        version="470.199.02",
        pcie_counters=False,
    ),
    # Early R535: the _v3 process calls write 32-byte entries (the v2 fields plus
    # usedGpuCcProtectedMemory) with no version bump, so bindings striding 24 bytes misread
    # every entry after the first (nvitop issue #88 on 535.98, fixed there by nvitop PR #79).
    # 535.54.03 is the driver in gpuopenanalytics/pynvml PR #48's report of the same bug.
    "r535_early": Driver(defines=("PROCINFO_V3_SIZE=32",), version="535.54.03"),
}


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("the NVML stand-in needs a C compiler: apt-get install gcc")
    return cc


def build(omit: Iterable[str] = (), defines: Iterable[str] = ()) -> Path:
    """Compile the stand-in without the functions in `omit` and with `-D` `defines`.

    Returns the folder holding ``libnvidia-ml.so.1``.  Builds are cached under
    ``.bench/nvml-standin/<hash of source, omit, defines, $CC>/`` and made by compiling
    to a temporary name and renaming, so concurrent builders are safe.
    """
    omit_set = sorted(set(omit))
    define_set = sorted(set(defines))
    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    key.update(repr((omit_set, define_set, os.environ.get("CC", "cc"))).encode())
    folder = CACHE / key.hexdigest()[:16]
    target = folder / LIBRARY
    if target.exists():
        return folder

    cc = _compiler()
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=folder)
    os.close(fd)
    command = [
        cc, "-std=c99", "-shared", "-fPIC", "-O1", "-Wall", "-pthread",
        f"-Wl,-soname,{LIBRARY}", "-o", tmp, str(SOURCE),
        *(f"-DOMIT_{name}" for name in omit_set),
        *(f"-D{d}" for d in define_set),
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"building the NVML stand-in failed:\n{' '.join(command)}\n{done.stderr}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return folder


def build_driver(driver: str = "current") -> Path:
    """The folder of the build for a named driver generation (see DRIVERS)."""
    d = DRIVERS[driver]
    return build(d.omit, d.defines)


# ---- scenarios ------------------------------------------------------------------------------

# One H100 SXM 80GB as nvidia-smi shows it.  NVIDIA/nccl issue #1264 (driver 550.54.15) quotes
# nvidia-smi on an 8x H100 SXM server: "NVIDIA H100 80GB HBM3", 0MiB / 81559MiB, 28C, 88W / 700W,
# 0% util, bus 00000000:18:00.0.  Other numbers are marked illustrative where they are used.
H100_NAME = "NVIDIA H100 80GB HBM3"
H100_TOTAL_BYTES = 81559 * MiB
H100_POWER_LIMIT_MW = 700_000
# Memory the driver reserves, counted in v1's `used` and apart in v2's `reserved`.  Illustrative:
# it is a few hundred MiB (rust-nvml nvml-wrapper issue #57: an idle A100 showed 912 MB used via
# v1 and 7.8 MB via v2).
H100_RESERVED_BYTES = 490 * MiB


@dataclass
class Process:
    """A process on a GPU; ``used_bytes=None`` is NVML_VALUE_NOT_AVAILABLE."""

    pid: int
    used_bytes: int | None = 600 * MiB


@dataclass
class MigInstance:
    """A MIG device in parent slot `slot` (0..6)."""

    slot: int
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    total_bytes: int = 9728 * MiB  # illustrative size of a 1g.10gb slice
    used_bytes: int = 0
    processes: list[Process] = field(default_factory=list)


@dataclass
class Gpu:
    """What one GPU answers.  Defaults: an H100 SXM 80GB (see the module constants)."""

    uuid: str
    name: str = H100_NAME
    util_pct: int = 50
    mem_util_pct: int = 20
    total_bytes: int = H100_TOTAL_BYTES
    reserved_bytes: int = H100_RESERVED_BYTES
    used_bytes: int = 0  # nvidia-smi's figure (v2 `used`): 0 MiB idle, per NVIDIA/nccl #1264
    power_mw: int = 88_000  # idle, per NVIDIA/nccl #1264
    power_limit_mw: int = H100_POWER_LIMIT_MW
    temp_c: int = 28  # idle, per NVIDIA/nccl #1264
    sm_clock_mhz: int = 1980  # illustrative (H100 SXM's top SM clock)
    mem_clock_mhz: int = 2619  # illustrative
    pcie_kib_s: tuple[int, int] = (1000, 500)  # rx, tx KB/s; illustrative
    pcie_delay_ms: int = 0  # real drivers measure over 20 ms (nvml.h); 0 keeps tests fast
    pcie_bytes: tuple[int, int] | None = (123_456_789, 98_765_432)  # rx, tx cumulative; illustrative
    pcie_counters_unsupported: bool = False
    nvlink: tuple[int, int, int] | None = None  # links, rx KiB, tx KiB cumulative; H100 SXM has 18 links
    clock_events: int = 0
    ecc: int = 0
    processes: list[Process] = field(default_factory=list)
    graphics_processes: list[Process] = field(default_factory=list)
    util_samples: list[tuple[int, int, int, int]] = field(default_factory=list)  # pid, ts µs, sm%, mem%
    unsupported: set[str] = field(default_factory=set)
    no_permission: set[str] = field(default_factory=set)
    lost: bool = False
    gpm: tuple[float, float] | None = None  # SM %, any-tensor %; None: GPM unsupported
    mig: list[MigInstance] | None = None  # None: MIG disabled
    cc: tuple[int, int] = (9, 0)

    def lines(self, i: int) -> list[str]:
        p = f"gpu {i}"
        out = [
            f"{p} uuid {self.uuid}",
            f'{p} name "{_quotable(self.name)}"',
            f"{p} util {self.util_pct} {self.mem_util_pct}",
            f"{p} memory {self.total_bytes} {self.reserved_bytes} {self.used_bytes}",
            f"{p} power {self.power_mw} {self.power_limit_mw}",
            f"{p} temp {self.temp_c}",
            f"{p} clocks {self.sm_clock_mhz} {self.mem_clock_mhz}",
            f"{p} pcie_kib_s {self.pcie_kib_s[0]} {self.pcie_kib_s[1]}",
            f"{p} pcie_delay_ms {self.pcie_delay_ms}",
            f"{p} clock_events {self.clock_events:#x}",
            f"{p} ecc {self.ecc}",
            f"{p} cc {self.cc[0]} {self.cc[1]}",
        ]
        if self.pcie_bytes is not None:
            out.append(f"{p} pcie_bytes {self.pcie_bytes[0]} {self.pcie_bytes[1]}")
        if self.pcie_counters_unsupported:
            out.append(f"{p} pcie_counters_unsupported 1")
        if self.nvlink is not None:
            out.append(f"{p} nvlink {self.nvlink[0]} {self.nvlink[1]} {self.nvlink[2]}")
        out += [f"{p} process {q.pid} {_bytes(q.used_bytes)}" for q in self.processes]
        out += [f"{p} graphics_process {q.pid} {_bytes(q.used_bytes)}" for q in self.graphics_processes]
        out += [f"{p} util_sample {pid} {ts} {sm} {mem}" for pid, ts, sm, mem in self.util_samples]
        out += [f"{p} unsupported {fn}" for fn in sorted(self.unsupported)]
        out += [f"{p} no_permission {fn}" for fn in sorted(self.no_permission)]
        if self.lost:
            out.append(f"{p} lost 1")
        if self.gpm is not None:
            out.append(f"{p} gpm {self.gpm[0]!r} {self.gpm[1]!r}")
        if self.mig is not None:
            out.append(f"{p} mig 1")
            for m in self.mig:
                out.append(f'{p} mig_instance {m.slot} {m.uuid} "{_quotable(m.name)}" {m.total_bytes} {m.used_bytes}')
                out += [f"{p} mig_process {m.slot} {q.pid} {_bytes(q.used_bytes)}" for q in m.processes]
        return out


@dataclass
class Scenario:
    """The whole machine: its GPUs (numbered by position) and driver."""

    gpus: list[Gpu]
    driver: str = "550.54.15"
    cuda: int = 12040  # CUDA 12.4, as nvmlSystemGetCudaDriverVersion encodes it
    init_error: int = 0  # non-zero: nvmlInit answers this code

    def text(self) -> str:
        lines = [f"driver {self.driver}", f"cuda {self.cuda}", f"init_error {self.init_error}"]
        for i, gpu in enumerate(self.gpus):
            lines += gpu.lines(i)
        return "\n".join(lines) + "\n"

    def write(self, path: Path | str) -> Path:
        """Write atomically, and make sure the library sees a change even within one second."""
        path = Path(path)
        before = path.stat() if path.exists() else None
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(self.text())
        os.replace(tmp, path)  # readers see the old file or the new one, never half
        if before is not None:
            # The library compares inode, size and mtime; os.replace already gives a new inode,
            # and a strictly later mtime covers filesystems that reuse inodes at once.
            now = path.stat().st_mtime_ns
            if now <= before.st_mtime_ns:
                later = before.st_mtime_ns + 1_000_000
                os.utime(path, ns=(later, later))
        return path


def _quotable(name: str) -> str:
    if '"' in name or "\n" in name:
        raise ValueError(f"names cannot hold double quotes or newlines: {name!r}")
    return name


def _bytes(n: int | None) -> str:
    return "-" if n is None else str(n)


def h100_node(n: int = 8, **overrides: Any) -> Scenario:
    """`n` H100s with distinct UUIDs; `overrides` are Gpu fields applied to each."""
    gpus = [Gpu(uuid=f"GPU-8e4b3c1a-{i:04x}-4000-8000-{i:012x}", **overrides) for i in range(n)]
    return Scenario(gpus)


def for_driver(scenario: Scenario, driver: str) -> Scenario:
    """`scenario` as the named driver would report it: its version, and on drivers without
    PCIe byte counters every GPU's fields 197/198 NOT_SUPPORTED."""
    d = DRIVERS[driver]
    gpus = [g if d.pcie_counters else replace(g, pcie_counters_unsupported=True) for g in scenario.gpus]
    return replace(scenario, gpus=gpus, driver=d.version)


# ---- using it -------------------------------------------------------------------------------

_loaded: dict[Path, ctypes.CDLL] = {}


def library(driver: str = "current") -> ctypes.CDLL:
    """The built stand-in for `driver`, loaded into this process (one copy per build)."""
    folder = build_driver(driver)
    if folder not in _loaded:
        lib = ctypes.CDLL(str(folder / LIBRARY))
        lib.standin_calls.restype = ctypes.c_ulonglong
        lib.standin_calls.argtypes = [ctypes.c_char_p]
        _loaded[folder] = lib
    return _loaded[folder]


def calls(name: str, driver: str = "current") -> int:
    """How often this process called NVML function `name` of the `driver` build."""
    return int(library(driver).standin_calls(name.encode()))


def use_in_process(monkeypatch: Any, scenario_path: Path | str, driver: str = "current") -> ModuleType:
    """Point the real ``pynvml`` in this process at the stand-in, for one test.

    glibc reads LD_LIBRARY_PATH only when a process starts, so the library is
    handed to pynvml directly: its loader only loads when ``nvmlLib`` is None.
    Everything is undone by `monkeypatch` after the test; the stand-in's call
    counters and init count start from zero.
    """
    import pynvml

    if not hasattr(pynvml, "_nvmlGetFunctionPointer_cache"):
        raise RuntimeError(f"{pynvml.__file__} is not nvidia-ml-py's pynvml")
    lib = library(driver)
    lib.standin_reset()
    monkeypatch.setenv(ENV_VAR, str(scenario_path))
    monkeypatch.setattr(pynvml, "nvmlLib", lib)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    monkeypatch.setattr(pynvml, "_nvmlLib_refcount", 0)
    return pynvml


def env_for(
    scenario_path: Path | str, driver: str = "current", base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The variables a subprocess needs to load the stand-in for `driver` with this scenario.

    LD_LIBRARY_PATH puts the build first, ahead of `base`'s (default: this
    process's) LD_LIBRARY_PATH.
    """
    base = os.environ if base is None else base
    folder = str(build_driver(driver))
    rest = base.get("LD_LIBRARY_PATH")
    return {
        "LD_LIBRARY_PATH": f"{folder}{os.pathsep}{rest}" if rest else folder,
        ENV_VAR: str(scenario_path),
    }


__all__ = [
    "DRIVERS",
    "ENV_VAR",
    "Driver",
    "Gpu",
    "MigInstance",
    "Process",
    "Scenario",
    "build",
    "build_driver",
    "calls",
    "env_for",
    "for_driver",
    "h100_node",
    "library",
    "use_in_process",
]
