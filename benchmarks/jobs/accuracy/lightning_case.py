"""A healthy Lightning job for the accuracy corpus: a small convnet, Lightning's own DDP and sampler.

Run under torchrun (Lightning picks the ranks up from its environment):
    torchrun --nproc_per_node=2 benchmarks/jobs/accuracy/lightning_case.py --seconds 15
"""

from __future__ import annotations

import argparse
import datetime

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gputop.integrations.lightning import GputopCallback


class ConvNet(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 8 * 8, 10),
        )  # fmt: skip

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = TensorDataset(torch.randn(2048, 3, 32, 32), torch.randint(0, 10, (2048,)))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_time=datetime.timedelta(seconds=args.seconds),
        callbacks=[GputopCallback()],
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(ConvNet(), DataLoader(data, batch_size=64, shuffle=True))
    print(f"rank {trainer.global_rank}: {trainer.global_step} steps", flush=True)


if __name__ == "__main__":
    main()
