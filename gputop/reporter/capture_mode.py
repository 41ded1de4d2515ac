"""The reporter thread's CUDA graph capture interaction mode: thread-local, so its event queries never break a capture.

``torch.cuda.graph`` and ``make_graphed_callables`` capture in global mode by default, where a "potentially unsafe"
CUDA call (``cudaEventQuery`` among them) from any other thread in the default (global) interaction mode fails
and invalidates the capture.  The reporter thread queries events whenever it reads a window, so it puts itself in
thread-local mode around its reads (``cudaThreadExchangeStreamCaptureMode``), as PyTorch's own NCCL watchdog does
for the same queries (pytorch PR #148594): the capturing thread's capture is its own, untouched.  Events are
never recorded inside a capture (``RankCuda.record_step``, ``CudaTimeline``), so none read was captured.

Python has no binding for the call: it is made through ctypes on the CUDA runtime library torch already loaded
(found in ``/proc/self/maps``, never loaded anew), with the model's device current (a runtime call on a thread
with no context would make one on GPU 0).  Where it cannot be found the reads go on as before.  A stand-in
``torch.cuda`` offers ``exchange_capture_mode`` itself.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

THREAD_LOCAL = 1  # cudaStreamCaptureModeThreadLocal (0: global, 2: relaxed)
Exchange = Callable[[int], int]


def exchanger(cuda: Any) -> Exchange | None:
    """How this process sets a thread's capture interaction mode: the stand-in's own, else the runtime's through
    ctypes; None where the runtime torch loaded is not found, or has no such call."""
    own = getattr(cuda, "exchange_capture_mode", None)
    if callable(own):
        return own  # type: ignore[no-any-return]
    path = _loaded_cudart()
    if path is None:
        return None
    try:
        function = ctypes.CDLL(path).cudaThreadExchangeStreamCaptureMode
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.POINTER(ctypes.c_int)]
    function.restype = ctypes.c_int

    def exchange(mode: int) -> int:
        value = ctypes.c_int(mode)
        error = function(ctypes.byref(value))
        if error:
            raise RuntimeError(f"cudaThreadExchangeStreamCaptureMode returned CUDA error {error}")
        return value.value

    return exchange


def _loaded_cudart(maps: str = "/proc/self/maps") -> str | None:
    """The path of the ``libcudart.so`` this process has mapped (torch's), or None."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                path = line.rpartition(" ")[2].strip()
                if "/libcudart.so" in path:
                    return path
    except OSError:
        return None
    return None
