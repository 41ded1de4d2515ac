"""A 2-process CPU DDP run of the Hugging Face Trainer with the gputop callback; a tiny model built here.

Usage: hf_trainer_job.py STEPS OUTPUT_DIR.  Every 8th sample takes 10 ms to load, so
each step waits for data; TensorBoard logs go to OUTPUT_DIR/tb (TENSORBOARD_LOGGING_DIR).
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

from gputop.integrations.transformers import GputopCallback


class Slow(Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if index % 8 == 0:
            time.sleep(0.010)
        return {"x": torch.randn(32), "labels": torch.tensor(index % 4)}


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.net(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


if __name__ == "__main__":
    steps, output_dir = int(sys.argv[1]), sys.argv[2]
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", os.path.join(output_dir, "tb"))
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=8,
        logging_steps=10,
        report_to=["tensorboard"],
        save_strategy="no",
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    trainer = Trainer(model=Tiny(), args=args, train_dataset=Slow(), callbacks=[GputopCallback()])
    trainer.train()
    print(f"rank {dist.get_rank() if dist.is_initialized() else 0} done", flush=True)
    if dist.is_initialized():
        # As torch's docs ask: a gloo group left to the interpreter's teardown can abort the process there
        # ("terminate called without an active exception", pytorch/pytorch#190489), which failed this job once in CI.
        dist.destroy_process_group()
