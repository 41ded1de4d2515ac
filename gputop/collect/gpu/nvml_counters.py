"""PCIe and NVLink throughput from NVML's cumulative byte counters, differenced between samples.

``nvmlDeviceGetPcieThroughput`` measures over ~20 ms inside the call and
answers one direction per call: 40 ms per GPU, 320 ms of every sample on an
8-GPU node.  The field values ``NVML_FI_DEV_PCIE_COUNT_{TX,RX}_BYTES`` and
``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}`` are counters the driver keeps,
all read in one ``nvmlDeviceGetFieldValues`` call of microseconds; the rate is
their difference over the driver's own timestamps.

NVLink counters are per link; nvml.h: "A scopeId of UINT_MAX returns aggregate
value summed up across all links".  They count KiB; the PCIe ones count bytes.
On SXM/NVSwitch nodes NCCL's all-reduce goes over NVLink, so a GPU panel with
PCIe alone shows an idle bus while the gradients move.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PCIE_TX_BYTES = 197  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES
PCIE_RX_BYTES = 198  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES
NVLINK_TX_KIB = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
NVLINK_RX_KIB = 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
ALL_LINKS = 0xFFFFFFFF  # UINT_MAX

# field -> (NVML field id, scope id, bytes per counted unit)
COUNTERS: dict[str, tuple[int, int, int]] = {
    "pcie_tx_bytes_s": (PCIE_TX_BYTES, 0, 1),
    "pcie_rx_bytes_s": (PCIE_RX_BYTES, 0, 1),
    "nvlink_tx_bytes_s": (NVLINK_TX_KIB, ALL_LINKS, 1024),
    "nvlink_rx_bytes_s": (NVLINK_RX_KIB, ALL_LINKS, 1024),
}

NEEDS_TWO_SAMPLES = "counters need two samples"
COUNTER_RESET = "counter went back (GPU reset?)"
NO_NVLINK = "no NVLink on this GPU"
_SUCCESS, _NOT_SUPPORTED = 0, 3


@dataclass
class _Reading:
    timestamp_us: int
    value: int


class ThroughputCounters:
    """Per-device counter state: the previous reading of each counter, and the counters it lacks."""

    def __init__(self) -> None:
        self._previous: dict[tuple[str, str], _Reading] = {}
        self._absent: dict[tuple[str, str], str] = {}  # (device, field) -> why, for good

    def forget(self, device: str) -> None:
        """A lost or reset GPU starts over: its counters may have restarted from zero."""
        for table in (self._previous, self._absent):
            for key in [k for k in table if k[0] == device]:
                del table[key]

    def read(
        self, device: str, get_values: Callable[[list[tuple[int, int]]], Any], reason_of: Callable[[int], str]
    ) -> tuple[dict[str, float], dict[str, str]]:
        """Rates since the previous call for ``device``, and why each missing one is missing.

        ``get_values(ids)`` is one ``nvmlDeviceGetFieldValues`` call (None when
        it failed as a whole, which the caller records); ``reason_of`` names a
        per-field NVML return code.
        """
        rates: dict[str, float] = {}
        na: dict[str, str] = {key[1]: why for key, why in self._absent.items() if key[0] == device}
        wanted = [name for name in COUNTERS if name not in na]
        if not wanted:
            return rates, na
        values = get_values([COUNTERS[name][:2] for name in wanted])
        if values is None:
            return rates, na
        for name, value in zip(wanted, values, strict=False):
            code = int(value.nvmlReturn)
            if code != _SUCCESS:
                why = NO_NVLINK if code == _NOT_SUPPORTED and name.startswith("nvlink") else reason_of(code)
                na[name] = why
                if code == _NOT_SUPPORTED:
                    self._absent[(device, name)] = why
                continue
            now = _Reading(int(value.timestamp), int(value.value.ullVal))
            before = self._previous.get((device, name))
            self._previous[(device, name)] = now
            if before is None:
                na[name] = NEEDS_TWO_SAMPLES
            elif now.value < before.value:
                na[name] = COUNTER_RESET
            elif now.timestamp_us > before.timestamp_us:
                seconds = (now.timestamp_us - before.timestamp_us) / 1e6
                rates[name] = (now.value - before.value) * COUNTERS[name][2] / seconds
            else:
                na[name] = NEEDS_TWO_SAMPLES  # the driver did not refresh it since the last read
        return rates, na
