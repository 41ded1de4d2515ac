"""The Hugging Face Trainer asked for FSDP (``fsdp="full_shard"``) on CPU, 2 processes, gloo, with the gputop callback.

Accelerate turns FSDP on only for accelerator devices: on CPU the Trainer runs DDP instead, silently.
The job prints what the Trainer wrapped the model in, so a test can check gputop reports what ran.
The dataset and model are hf_trainer_job.py's.  Usage: hf_trainer_fsdp_job.py STEPS OUTPUT_DIR
"""

from __future__ import annotations

import sys

import torch.distributed as dist
from hf_trainer_job import Slow, Tiny  # the job beside this one (torchrun puts this folder on sys.path)
from transformers import Trainer, TrainingArguments

from gputop.integrations.transformers import GputopCallback

if __name__ == "__main__":
    steps, output_dir = int(sys.argv[1]), sys.argv[2]
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=8,
        logging_steps=10,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        disable_tqdm=True,
        remove_unused_columns=False,
        fsdp="full_shard",
    )
    trainer = Trainer(model=Tiny(), args=args, train_dataset=Slow(), callbacks=[GputopCallback()])
    trainer.train()
    rank = dist.get_rank() if dist.is_initialized() else 0
    print(f"rank {rank} fsdp enabled {trainer.is_fsdp_enabled} wrapped in {type(trainer.model_wrapped).__name__}")
