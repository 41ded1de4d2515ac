"""A 2-process Lightning FSDP2 run on CPU (gloo) with the gputop callback; each batch takes 10 ms to load.

``ModelParallelStrategy`` with ``configure_model`` sharding each linear layer and then the stack with
``fully_shard``, as Lightning's FSDP2 guide writes it.  Lightning calls ``training_step`` directly
(no wrapper), so the module's forward hooks see no training forward unless the step calls
``self(...)``: ``--self-call`` makes it do so, to show the callback then leaves the marking to the hooks.
FSDPStrategy (FSDP1) is not run here: Lightning refuses it without a CUDA accelerator.

Usage: lightning_fsdp_job.py STEPS [--self-call]
"""

from __future__ import annotations

import sys
import time

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, Dataset

from gputop.integrations.lightning import GputopCallback


class Slow(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, index: int) -> torch.Tensor:
        if index % 8 == 0:
            time.sleep(0.010)
        return torch.randn(32)


class Model(L.LightningModule):
    def __init__(self, *, self_call: bool) -> None:
        super().__init__()
        self.self_call = self_call
        self.net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for layer in self.net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        return self.net(batch)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        out = self(batch) if self.self_call else self.net(batch)
        return out.pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    steps = int(sys.argv[1])
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        max_steps=steps,
        callbacks=[GputopCallback()],
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(Model(self_call="--self-call" in sys.argv), DataLoader(Slow(), batch_size=8))
    print(f"rank {trainer.global_rank} done", flush=True)
