"""A 2-process Lightning DDP run on CPU with the gputop callback; each batch takes 10 ms to load."""

from __future__ import annotations

import sys
import time

import lightning as L
import torch
from torch import nn
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
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(32, 4)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.net(batch).pow(2).mean()

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        time.sleep(0.2)  # slow validation must not show up as loader wait

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    steps = int(sys.argv[1])
    log_dir = sys.argv[2] if len(sys.argv) > 2 else None  # CSV logs, where gputop's figures go too
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=steps,
        val_check_interval=10,
        limit_val_batches=4,
        callbacks=[GputopCallback()],
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=L.pytorch.loggers.CSVLogger(log_dir) if log_dir else False,
        log_every_n_steps=5,
        enable_checkpointing=False,
    )
    trainer.fit(Model(), DataLoader(Slow(), batch_size=8), DataLoader(torch.randn(64, 32), batch_size=8))
    print(f"rank {trainer.global_rank} done", flush=True)
