"""The processes on a GPU, through the newest versioned NVML call the driver has, read at its real stride.

nvidia-ml-py's ``nvmlDeviceGetComputeRunningProcesses`` always calls ``_v3``
and, on a driver without it (before R510), raises ``NVMLLibraryMismatchError``
instead of trying ``_v2`` or the unversioned v1.  And early R535 drivers wrote
``_v3`` entries of 32 bytes (with ``usedGpuCcProtectedMemory``) where the
bindings' struct has 24, so every entry after the first was read at the wrong
offset: PIDs read as memory and back (nvitop issue #88 and PR #79,
gpuopenanalytics/pynvml #50).

So gputop makes the C call itself, through the bindings' loaded library:
versions newest first, and for ``_v3`` the stride the driver actually wrote,
found by filling the buffer with a marker byte and seeing where the writes end.
Every entry starts ``unsigned int pid; unsigned long long usedGpuMemory`` at
offsets 0 and 8, whatever its version.
"""

from __future__ import annotations

import ctypes
from typing import Any, NamedTuple

# (C function suffix, entry sizes the driver may write): nvml.h's nvmlProcessInfo_v1_t is
# {pid, usedGpuMemory}; v2 adds gpuInstanceId and computeInstanceId; early R535 v3 added
# usedGpuCcProtectedMemory without changing the version.
VERSIONS: tuple[tuple[str, tuple[int, ...]], ...] = (("_v3", (24, 32)), ("_v2", (24,)), ("", (16,)))
_MARKER = 0xA5
_NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE as unsigned long long (WDDM, some vGPUs)
_SUCCESS = 0
_INSUFFICIENT_SIZE = 7


class ProcessEntry(NamedTuple):
    pid: int
    used_bytes: int | None


def list_processes(lib: Any, handle: Any, c_name: str, sizes: tuple[int, ...]) -> list[ProcessEntry]:
    """Call ``c_name`` (e.g. ``nvmlDeviceGetComputeRunningProcesses_v3``) on ``handle`` and decode it.

    ``lib`` is the pynvml module: its function-pointer lookup raises its
    FunctionNotFound error for a symbol the driver lacks, and its ``NVMLError``
    carries any other code, so ``Nvml.call_with`` reads both as usual.
    """
    fn = lib._nvmlGetFunctionPointer(c_name)
    count = ctypes.c_uint(0)
    ret = fn(handle, ctypes.byref(count), None)
    if ret == _SUCCESS:
        return []
    if ret != _INSUFFICIENT_SIZE:
        raise lib.NVMLError(ret)
    # Room for processes that start between the two calls, as the bindings leave.
    capacity = count.value * 2 + 5
    buffer = (ctypes.c_ubyte * (capacity * max(sizes)))()
    ctypes.memset(buffer, _MARKER, len(buffer))
    count = ctypes.c_uint(capacity)
    ret = fn(handle, ctypes.byref(count), buffer)
    if ret != _SUCCESS:
        raise lib.NVMLError(ret)
    n = count.value
    stride = written_stride(bytes(buffer), n, sizes)
    entries = []
    for i in range(n):
        pid = ctypes.c_uint.from_buffer(buffer, i * stride).value
        used = ctypes.c_ulonglong.from_buffer(buffer, i * stride + 8).value
        entries.append(ProcessEntry(pid, None if used == _NOT_AVAILABLE else used))
    return entries


def written_stride(data: bytes, n: int, sizes: tuple[int, ...]) -> int:
    """The entry size the driver wrote ``n`` entries at: the largest of ``sizes`` whose last entry's
    tail was written, where a smaller stride would have left it all marker bytes."""
    if n == 0:
        return sizes[0]
    for size in sorted(sizes, reverse=True)[:-1]:
        smaller = max(s for s in sizes if s < size)
        tail = data[n * smaller : n * size]
        if any(byte != _MARKER for byte in tail):
            return size
    return min(sizes)
