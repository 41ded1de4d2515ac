"""The one door to NVML: every call goes through ``Nvml.call``, which never raises.

NVML fails in many ordinary ways: no driver on a laptop, a field a consumer
GPU does not report, a container without permission, a GPU that fell off the
bus mid-run.  Each of those becomes an N/A value here (``value`` None and a
short ``na`` reason the UI can show), so the sampler is a plain sequence of
reads with no error handling of its own.  ``DeviceReads`` is one device's reads
in one sample: it gathers those reasons per field and stops asking a GPU that
fell off the bus.

A field found unsupported (or forbidden) on a device is remembered and not
asked again: some of these calls cost milliseconds, and the answer does not
change while the driver stays loaded.  A function missing from the driver or
from the installed pynvml is remembered for every device.

The backend is anything with pynvml's function and constant names, imported
lazily, so tests pass a fake and importing gputop never loads libnvidia-ml.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

# pynvml's error codes (nvml.h); read from the backend when it has them.
_ERROR_CODES = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_GPU_IS_LOST": 15,
}

NOT_SUPPORTED = "not supported"
NO_PERMISSION = "no permission"
NOT_FOUND = "not found"
GPU_LOST = "GPU is lost"
NOT_IN_DRIVER = "not in this driver"
NOT_IN_PYNVML = "not in this pynvml"
UNINITIALIZED = "NVML not initialized"
NO_LIBRARY = "libnvidia-ml not found (no NVIDIA driver installed)"
NO_DRIVER = "NVIDIA driver not loaded"
NO_PYNVML = "pynvml not installed (pip install nvidia-ml-py)"

# Answers that stay true while the driver is loaded: asking again only costs time.
_REMEMBERED = frozenset({NOT_SUPPORTED, NO_PERMISSION})
_FUNCTION_MISSING = frozenset({NOT_IN_DRIVER, NOT_IN_PYNVML})


class NvmlResult(NamedTuple):
    """A value, or None and why (``na``)."""

    value: Any
    na: str | None = None


class Nvml:
    """Lazy, thread-safe NVML access that turns every failure into an N/A reason."""

    def __init__(self, backend: Any | None = None) -> None:
        self._backend = backend
        self._lib: Any | None = None
        self._lock = threading.Lock()
        self._ready = False
        self._failed: str | None = None  # why init failed; permanent for this object
        self._codes: dict[int, str] = {}
        self._unsupported: dict[tuple[str, str], str] = {}  # (device, field) -> reason
        self._missing: dict[str, str] = {}  # function name -> reason
        self.generation = 0  # bumped on every successful init: handles from older ones are stale

    def start(self) -> str | None:
        """Initialise NVML if needed; None when ready, else one line saying why not."""
        with self._lock:
            if self._ready:
                return None
            if self._failed is not None:
                return self._failed
            if self._lib is None:
                try:
                    self._lib = self._backend if self._backend is not None else _import_pynvml()
                except ImportError:
                    self._failed = NO_PYNVML
                    return self._failed
                self._codes = {int(getattr(self._lib, name, code)): name for name, code in _ERROR_CODES.items()}
            try:
                self._lib.nvmlInit()
            except Exception as exc:
                reason = self._reason(exc)
                # Uninitialized here is odd but transient; everything else (no
                # library, no driver, no permission) will not change by retrying.
                if reason != UNINITIALIZED:
                    self._failed = f"NVML unavailable: {reason}"
                    return self._failed
                return f"NVML unavailable: {reason}"
            self._ready = True
            self.generation += 1
            return None

    @property
    def lib(self) -> Any:
        """The backend module (only meaningful after ``start()`` returned None)."""
        return self._lib

    def constant(self, name: str, default: int) -> int:
        """A pynvml constant, or nvml.h's value when this pynvml lacks it."""
        return int(getattr(self._lib, name, default))

    def call(self, fn_name: str, *args: Any, device: str | None = None, field: str | None = None) -> NvmlResult:
        """Call the bindings' ``fn_name(*args)``; with ``device`` and ``field``, remember an unsupported answer.

        ``field`` names what is being read (one per distinct query, e.g.
        "pcie_rx_bytes_s"), so one unsupported counter does not hide another
        read through the same function.
        """
        return self.call_with(fn_name, None, *args, device=device, field=field)

    def call_with(
        self,
        name: str,
        fn: Callable[..., Any] | None,
        *args: Any,
        device: str | None = None,
        field: str | None = None,
    ) -> NvmlResult:
        """Call ``fn(*args)`` (None: the bindings' function ``name``), with ``call``'s bookkeeping.

        ``fn`` is gputop's own code over the bindings, such as a versioned C
        call; ``name`` is the C function it reaches, so a driver without it is
        remembered under that name as a missing binding is.
        """
        if not self._ready:
            why = self.start()
            if why is not None:
                return NvmlResult(None, why)
        missing = self._missing.get(name)
        if missing is not None:
            return NvmlResult(None, missing)
        key = (device, field) if device is not None and field is not None else None
        if key is not None:
            known = self._unsupported.get(key)
            if known is not None:
                return NvmlResult(None, known)
        if fn is None:
            fn = getattr(self._lib, name, None)
            if fn is None:
                self._missing[name] = NOT_IN_PYNVML
                return NvmlResult(None, NOT_IN_PYNVML)
        try:
            return NvmlResult(fn(*args))
        except Exception as exc:
            reason = self._reason(exc)
        if reason in _FUNCTION_MISSING:
            self._missing[name] = reason
        elif reason in _REMEMBERED and key is not None:
            self._unsupported[key] = reason
        elif reason == UNINITIALIZED:
            self._ready = False  # someone shut NVML down under us: init again next call
        return NvmlResult(None, reason)

    def is_missing(self, fn_name: str) -> bool:
        """Whether a function turned out to be absent from the driver or pynvml."""
        return fn_name in self._missing

    def forget_device(self, device: str) -> None:
        """Drop what was remembered about a device (after it was lost, a reset may change it)."""
        for key in [k for k in self._unsupported if k[0] == device]:
            del self._unsupported[key]

    def shutdown(self) -> None:
        """Release NVML; a later call initialises it again."""
        with self._lock:
            if self._ready and self._lib is not None:
                with contextlib.suppress(Exception):  # shutting down: a failure changes nothing
                    self._lib.nvmlShutdown()
            self._ready = False

    def reason_of_code(self, code: int) -> str:
        """The short reason for an NVML return code (one field's answer inside a batched call)."""
        name = self._codes.get(code)
        return _REASONS[name] if name is not None else f"NVML error {code}"

    def _reason(self, exc: Exception) -> str:
        """A short reason for any exception out of the backend."""
        code = getattr(exc, "value", None)
        name = self._codes.get(code) if isinstance(code, int) else None
        if name is not None:
            return _REASONS[name]
        if isinstance(exc, AttributeError):
            return NOT_IN_PYNVML
        if type(exc).__name__ == "NVMLLibraryMismatchError":
            # nvidia-ml-py >= 12.535 maps an unversioned call to its newest version (_v3) and turns
            # that version's FunctionNotFound into this, which is no NVMLError and has no code.
            return NOT_IN_DRIVER
        try:
            text = str(exc)
        except Exception:  # pynvml's __str__ calls into NVML and can fail itself
            text = ""
        return f"NVML error: {text or type(exc).__name__}"


class DeviceReads:
    """The reads of one device in one sample: collects N/A reasons, stops early on a lost GPU."""

    def __init__(self, nvml: Nvml, device: str, handle: Any) -> None:
        self.nvml = nvml
        self.device = device
        self.handle = handle
        self.na: dict[str, str] = {}
        self.lost = False

    def get(self, field: str, fn_name: str, *args: Any, record: bool = True) -> Any:
        """The bindings' ``fn_name`` on this device; a failure's reason goes in ``na[field]``."""
        return self.get_with(field, fn_name, None, *args, record=record)

    def get_with(self, field: str, name: str, fn: Callable[..., Any] | None, *args: Any, record: bool = True) -> Any:
        """``get`` for gputop's own function over the bindings (None: the bindings' ``name`` itself)."""
        if self.lost:
            if record:
                self.na[field] = GPU_LOST
            return None
        value, why = self.nvml.call_with(name, fn, self.handle, *args, device=self.device, field=field)
        if why is not None:
            if why == GPU_LOST:
                self.lost = True  # every further read would fail the same way, some slowly
            if record:
                self.na[field] = why
        return value

    def first(self, field: str, fn_names: tuple[str, ...], *args: Any) -> Any:
        """The first of several equivalent functions this driver has (newer name first)."""
        for fn_name in fn_names:
            value = self.get(field, fn_name, *args)
            if value is not None or not self.nvml.is_missing(fn_name) or self.lost:
                return value
            self.na.pop(field, None)
        self.na[field] = "not in this driver or pynvml"
        return None


_REASONS = {
    "NVML_ERROR_UNINITIALIZED": UNINITIALIZED,
    "NVML_ERROR_NOT_SUPPORTED": NOT_SUPPORTED,
    "NVML_ERROR_NO_PERMISSION": NO_PERMISSION,
    "NVML_ERROR_NOT_FOUND": NOT_FOUND,
    "NVML_ERROR_DRIVER_NOT_LOADED": NO_DRIVER,
    "NVML_ERROR_LIBRARY_NOT_FOUND": NO_LIBRARY,
    "NVML_ERROR_FUNCTION_NOT_FOUND": NOT_IN_DRIVER,
    "NVML_ERROR_GPU_IS_LOST": GPU_LOST,
}


def _import_pynvml() -> Any:
    import pynvml  # from nvidia-ml-py; imported here so a machine without it still runs gputop

    return pynvml


def text(value: Any) -> str:
    """NVML strings come back as bytes from older pynvml and str from newer."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)
