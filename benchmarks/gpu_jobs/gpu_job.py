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
``--wrap fsdp2`` shards each Linear and the root with ``fully_shard`` instead of DDP;
``--user-all-reduce`` all-reduces the loss each step, as a script logging a global metric does.
"""

from __future__ import annotations

import argparse
import os
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
    parser.add_argument("--wrap", choices=["ddp", "fsdp2"], default="ddp", help="fsdp2: fully_shard each Linear, root")
    parser.add_argument("--user-all-reduce", action="store_true", help="all-reduce the loss each step, as a metric")
    args = parser.parse_args()
    shape = SHAPES[args.mode]

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
    else:
        model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers).to(device), device_ids=[index])
    gputop.watch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    data = Batches(shape["width"], shape["batch"], shape["delay_s"])
    loader = DataLoader(data, batch_size=shape["batch"], num_workers=0, collate_fn=keep_batch)

    steps = 0
    started = time.perf_counter()
    for x, y in gputop.track(loader):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=shape["autocast"]):
            loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if args.user_all_reduce:
            dist.all_reduce(loss.detach())
        steps += 1
        if steps == args.steps:
            break
    torch.cuda.synchronize(device)  # this device's: a bare synchronize() would start a context on the current one
    elapsed = time.perf_counter() - started
    print(f"steps {steps} steps_per_s {steps / elapsed:.3f}", flush=True)
    time.sleep(args.hold_s)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
