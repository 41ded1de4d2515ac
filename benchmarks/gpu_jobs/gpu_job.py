"""A 1-rank NCCL DDP job for `make gpu-check`, in the shape one check needs.

Run under torchrun: ``torchrun --standalone --nproc_per_node=1 benchmarks/gpu_jobs/gpu_job.py --mode gpu_bound``.
Modes: ``gpu_bound`` (big bf16 matmuls, the GPU busy all step), ``launch_bound``
(a tiny MLP at batch 2: the host's Python and launches are the step),
``fp32`` (a tensor-core-sized MLP without autocast), ``bf16`` (the same under
bf16 autocast), ``slow_loader`` (60 ms per batch in the dataset).  Prints
``steps N steps_per_s X`` when done, measured around the loop only.

``--placement``: ``set_device`` (the default) calls ``torch.cuda.set_device(local_rank)``
and trains there; ``last_gpu`` never calls it and puts the model on the last
visible GPU with ``model.to(device)``, as PyTorch's DDP tutorial does, so the
training thread's current device stays 0.  ``--hold-s`` keeps the process (and
its CUDA contexts) alive that long after training, for ``nvidia-smi`` to see.
``--wrap fsdp2`` shards each Linear and the root with ``fully_shard`` instead of DDP; ``--wrap none``
trains the plain module (its phases then come from gputop's CUDA events, not DDP's logger);
``--user-all-reduce`` all-reduces the loss each step, as a script logging a global metric does.

The checks of the phases and waits on the GPU clock (docs/gpu.md):

- ``--profile-steps A:B`` runs ``torch.profiler`` (CUDA activity) over steps A to B-1 and prints
  ``profiler forward_ms X backward_ms Y steps N``: the CUDA kernel time, per step, of the model's forward
  (a ``record_function`` around ``model(x)``) and of everything from there to the optimizer, as gputop
  splits a step.
- ``--exposed-wait-ms D`` queues a ``torch.cuda._sleep`` of about D ms on a side stream after each
  backward and makes the compute stream wait for it with ``current_stream().wait_event``, inside
  ``tap.waits_for`` as FSDP2's waits run; prints ``side delay_ms X`` (the sleep's own length, from
  events on the side stream, mean over the steps).
- ``--profile-flops A:B`` runs ``torch.profiler`` with ``with_flops`` over steps A to B-1 and prints
  ``profiler flops_per_step X step_ms Y``: the FLOPs its own formulas count a step (matmuls, convolutions,
  and the elementwise mul and add it also counts), and the wall time of those steps, the device synchronised
  at both ends.
- ``--async-all-reduce`` all-reduces a 4-MiB tensor each step with ``async_op=True`` and waits on it;
  ``--count-syncs`` counts ``synchronize`` calls (device, stream, event) made by any thread but this one
  and prints ``syncs N``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

import gputop


class Batches(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Random samples fetched a batch at a time (``__getitems__``), with an optional delay per batch.

    A whole batch per call keeps the host's per-sample Python out of the step, so
    a GPU-bound mode stays GPU-bound; the DataLoader still knows the batch size.
    """

    def __init__(self, width: int, batch: int, delay_s: float) -> None:
        self.x = torch.randn(batch, width)
        self.y = torch.randint(0, 10, (batch,))
        self.delay_s = delay_s

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index % len(self.x)], self.y[index % len(self.y)]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.x[: len(indices)], self.y[: len(indices)]


def keep_batch(batch: Any) -> Any:
    """The collate function: ``__getitems__`` already returns a batch."""
    return batch


SHAPES: dict[str, dict[str, Any]] = {
    "gpu_bound": {"width": 8192, "layers": 8, "batch": 8192, "delay_s": 0.0, "autocast": True},
    "launch_bound": {"width": 32, "layers": 2, "batch": 2, "delay_s": 0.0, "autocast": False},
    "fp32": {"width": 4096, "layers": 4, "batch": 1024, "delay_s": 0.0, "autocast": False},
    "bf16": {"width": 4096, "layers": 4, "batch": 1024, "delay_s": 0.0, "autocast": True},
    "slow_loader": {"width": 1024, "layers": 2, "batch": 256, "delay_s": 0.06, "autocast": True},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=sorted(SHAPES), required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--placement", choices=["set_device", "last_gpu"], default="set_device")
    parser.add_argument("--hold-s", type=float, default=0.0)
    parser.add_argument("--wrap", choices=["ddp", "fsdp2", "none"], default="ddp",
                        help="fsdp2: fully_shard each Linear, root; none: the plain module")  # fmt: skip
    parser.add_argument("--user-all-reduce", action="store_true", help="all-reduce the loss each step, as a metric")
    parser.add_argument("--profile-steps", help="A:B: torch.profiler's CUDA time of forward and backward, steps A..B-1")
    parser.add_argument("--profile-flops", help="A:B: torch.profiler's FLOPs a step over steps A..B-1")
    parser.add_argument("--exposed-wait-ms", type=float, default=0.0, help="a side-stream delay waited on each step")
    parser.add_argument("--async-all-reduce", action="store_true", help="an async 4-MiB all-reduce waited each step")
    parser.add_argument("--count-syncs", action="store_true", help="count synchronize calls of other threads")
    args = parser.parse_args()
    shape = SHAPES[args.mode]
    syncs = count_syncs() if args.count_syncs else None
    if args.exposed_wait_ms:  # FSDP2's module, loaded before watch(), so gputop times the waits made as FSDP2's are
        for fsdp2 in ("torch.distributed.fsdp._fully_shard", "torch.distributed._composable.fsdp"):
            with contextlib.suppress(ImportError):
                importlib.import_module(fsdp2)
                break

    dist.init_process_group("nccl")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.placement == "set_device":
        index = local_rank
        torch.cuda.set_device(index)
    else:
        index = torch.cuda.device_count() - 1  # and no set_device: device 0 stays current
    device = torch.device("cuda", index)
    layers: list[nn.Module] = []
    for _ in range(shape["layers"] - 1):
        layers += [nn.Linear(shape["width"], shape["width"]), nn.ReLU()]
    layers.append(nn.Linear(shape["width"], 10))
    if args.wrap == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        model = nn.Sequential(*layers).to(device)
        mesh = init_device_mesh("cuda", (dist.get_world_size(),), mesh_dim_names=("dp",))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif args.wrap == "none":
        model = nn.Sequential(*layers).to(device)
    else:
        model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers).to(device), device_ids=[index])
    reporter = gputop.watch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    data = Batches(shape["width"], shape["batch"], shape["delay_s"])
    loader = DataLoader(data, batch_size=shape["batch"], num_workers=0, collate_fn=keep_batch)
    delay = SideDelay(device, args.exposed_wait_ms) if args.exposed_wait_ms else None
    exchanged = torch.ones(1 << 20, device=device)  # 4 MiB
    profiled = range(*map(int, args.profile_steps.split(":"))) if args.profile_steps else range(0)
    profiler = None
    counted = range(*map(int, args.profile_flops.split(":"))) if args.profile_flops else range(0)
    flops_profiler: Any = None
    flops_started = 0.0
    works: list[Any] = []

    steps = 0
    started = time.perf_counter()
    for x, y in gputop.track(loader):
        if steps == profiled.start and profiled:
            profiler = start_profiler()
        if steps == counted.start and counted:
            torch.cuda.synchronize(device)
            flops_profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_flops=True)
            flops_profiler.__enter__()
            flops_started = time.perf_counter()
        with torch.profiler.record_function(BATCH):
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=shape["autocast"]):
            with torch.profiler.record_function(FORWARD):
                out = model(x)
            loss = nn.functional.cross_entropy(out, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if delay is not None and reporter is not None:
            delay.wait(reporter)
        if args.async_all_reduce:
            work = dist.all_reduce(exchanged, async_op=True)
            work.wait()
            works = [*works[-19:], work]  # the job's own reference: NCCL's durations, read after its last sync
        optimizer.step()
        if args.user_all_reduce:
            dist.all_reduce(loss.detach())
        steps += 1
        if profiler is not None and steps == profiled.stop:
            profiler.__exit__(None, None, None)
            print_profile(profiler, len(profiled))
            profiler = None
        if flops_profiler is not None and steps == counted.stop:
            torch.cuda.synchronize(device)
            step_ms = (time.perf_counter() - flops_started) * 1e3 / len(counted)
            flops_profiler.__exit__(None, None, None)
            flops = sum(e.flops for e in flops_profiler.key_averages() if e.flops) / len(counted)
            print(f"profiler flops_per_step {flops:.0f} step_ms {step_ms:.3f}", flush=True)
            flops_profiler = None
        if steps == args.steps:
            break
    torch.cuda.synchronize(device)  # this device's: a bare synchronize() would start a context on the current one
    elapsed = time.perf_counter() - started
    print(f"steps {steps} steps_per_s {steps / elapsed:.3f}", flush=True)
    if delay is not None:
        print(f"side delay_ms {delay.mean_ms():.3f}", flush=True)
    if syncs is not None:
        print(f"syncs {syncs[0]}", flush=True)
    if works:
        with contextlib.suppress(RuntimeError):  # TORCH_NCCL_ENABLE_TIMING unset: no durations to read
            print(f"nccl duration_ms {sum(w._get_duration() for w in works) / len(works):.4f}", flush=True)
    time.sleep(args.hold_s)
    dist.destroy_process_group()


FORWARD = "gpu_check.forward"  # the record_function around the model's forward: the profiler's forward
BATCH = "gpu_check.batch"  # and around the batch's copy to the GPU, which gputop counts in neither phase


def start_profiler() -> Any:
    profiler = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    )
    profiler.__enter__()
    return profiler


def print_profile(profiler: Any, steps: int) -> None:
    """The CUDA kernel time a step of the forward (the kernels its ops launched, children included) and of the
    rest up to the optimizer (loss, backward), as gputop splits a step: the batch's copy and the optimizer's
    own kernels (its record_function, ``Optimizer.step#…``) are in neither.

    Every kernel is counted once, under the top-level host op that launched it (the training thread's, and
    the autograd engine's for backward); the GPU-side copies of annotations are not kernels and not counted.
    """
    cpu = torch.autograd.DeviceType.CPU
    tops = [e for e in profiler.events() if e.device_type == cpu and e.cpu_parent is None]
    total_us = sum(e.device_time_total for e in tops)
    forward_us = sum(e.device_time_total for e in tops if e.name == FORWARD)
    other_us = sum(e.device_time_total for e in tops if e.name == BATCH or e.name.startswith("Optimizer.step#"))
    backward_us = total_us - forward_us - other_us
    print(f"profiler forward_ms {forward_us / 1e3 / steps:.3f} backward_ms {backward_us / 1e3 / steps:.3f} "
          f"steps {steps}", flush=True)  # fmt: skip


class SideDelay:
    """A delay of known length on a side stream, and the compute stream made to wait for it as FSDP2 waits."""

    def __init__(self, device: torch.device, ms: float) -> None:
        self.device = device
        self.side = torch.cuda.Stream(device)
        self.cycles = int(ms * self.cycles_per_ms())
        self.timed: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def cycles_per_ms(self) -> float:
        """How many ``_sleep`` cycles make a millisecond on this GPU, from one timed million-cycle sleep."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.side):
            start.record()
            torch.cuda._sleep(1_000_000)
            end.record()
        end.synchronize()
        return 1_000_000 / start.elapsed_time(end)

    def wait(self, reporter: Any) -> None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        compute = torch.cuda.current_stream(self.device)
        self.side.wait_stream(compute)  # the delay starts where the compute stream is now, as FSDP2's streams do
        with torch.cuda.stream(self.side):
            start.record()
            torch.cuda._sleep(self.cycles)
            end.record()
        with reporter.tap.waits_for("all_gather", None):  # where FSDP2's wait_for_unshard makes its wait
            compute.wait_event(end)
        self.timed.append((start, end))

    def mean_ms(self) -> float:
        """The delays' own lengths, from their events (read once the job has synchronised its device)."""
        return sum(start.elapsed_time(end) for start, end in self.timed) / max(len(self.timed), 1)


def count_syncs() -> list[int]:
    """Count every ``synchronize`` (device, stream, event) a thread other than this one makes from now on."""
    main = threading.get_ident()
    count = [0]

    def counted(original: Any) -> Any:
        def synchronize(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != main:
                count[0] += 1
            return original(*args, **kwargs)

        return synchronize

    torch.cuda.synchronize = counted(torch.cuda.synchronize)
    torch.cuda.Event.synchronize = counted(torch.cuda.Event.synchronize)
    torch.cuda.Stream.synchronize = counted(torch.cuda.Stream.synchronize)
    return count


if __name__ == "__main__":
    main()
