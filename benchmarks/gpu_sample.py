"""What one GPU sample costs on an 8-GPU node whose PCIe throughput call blocks for 20 ms.

``nvmlDeviceGetPcieThroughput`` measures over ~20 ms inside the call, one
direction per call: on 8 GPUs that is 320 ms of every sample for the call
alone.  The sampler reads PCIe and NVLink from the driver's byte counters
instead (``gputop/collect/gpu/nvml_counters.py``).  This runs the real sampler
through the real nvidia-ml-py over the stand-in libnvidia-ml (tests/support/nvml_standin)
with that 20-ms call present, and prints:

- the wall time of one ``GpuSampler.sample()`` (median and max over ``--samples``),
- its CPU time, as a share of one core at 1 Hz (the dashboard's rate),
- for reference, what the two blocking PCIe calls per GPU would have taken.

Targets (issue #21): <= 50 ms per sample and <= 1% of a core at 1 Hz.

Run: .venv/bin/python benchmarks/gpu_sample.py [--gpus 8] [--samples 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gputop.collect.gpu.nvml import Nvml  # noqa: E402
from gputop.collect.gpu.sampler import GpuSampler  # noqa: E402
from tests.support.nvml_standin import ENV_VAR, Process, build_driver, calls, h100_node, library  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--pcie-delay-ms", type=int, default=20)
    args = parser.parse_args()

    import os

    import pynvml

    node = h100_node(args.gpus, pcie_delay_ms=args.pcie_delay_ms, nvlink=(18, 1 << 30, 1 << 30))
    for i, gpu in enumerate(node.gpus):
        gpu.processes = [Process(pid=1000 + i), Process(pid=2000 + i)]
        gpu.util_samples = [(1000 + i, 1_000 + k, 80, 30) for k in range(10)]
    scenario = node.write(Path(tempfile.mkdtemp(prefix="gputop-bench-")) / "nvml-scenario")
    os.environ[ENV_VAR] = str(scenario)
    build_driver("current")
    pynvml.nvmlLib = library("current")  # glibc read LD_LIBRARY_PATH at start: hand the library over

    sampler = GpuSampler(Nvml())
    first = sampler.sample()
    assert first.unavailable is None and len(first.gpus) == args.gpus, first.unavailable
    walls, cpus = [], []
    for _ in range(args.samples):
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        sample = sampler.sample()
        cpus.append(time.thread_time() - cpu0)
        walls.append(time.perf_counter() - wall0)
    assert all(g.pcie_rx_bytes_s is not None for g in sample.gpus), [g.na for g in sample.gpus]
    blocking_calls = calls("nvmlDeviceGetPcieThroughput")

    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    start = time.perf_counter()
    pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_RX_BYTES)
    pynvml.nvmlDeviceGetPcieThroughput(handle, pynvml.NVML_PCIE_UTIL_TX_BYTES)
    per_gpu = time.perf_counter() - start
    sampler.close()

    python = sys.version.split()[0]
    print(f"{args.gpus} GPUs, PCIe throughput call {args.pcie_delay_ms} ms, {args.samples} samples, Python {python}")
    print(f"sample wall time   median {statistics.median(walls) * 1e3:6.2f} ms   max {max(walls) * 1e3:6.2f} ms")
    print(f"sample CPU time    median {statistics.median(cpus) * 1e3:6.2f} ms   = "
          f"{statistics.median(cpus) * 100:.2f}% of a core at 1 Hz")  # fmt: skip
    print(f"blocking PCIe calls made by the sampler: {blocking_calls}")
    print(f"reference: the two blocking PCIe calls per GPU take {per_gpu * 1e3:.1f} ms, "
          f"{per_gpu * args.gpus * 1e3:.0f} ms for {args.gpus} GPUs")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
