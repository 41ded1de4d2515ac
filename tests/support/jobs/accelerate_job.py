"""A plain Accelerate training loop, written as Accelerate's ``nlp_example.py`` is, on a tiny BERT built here.

Run under ``torchrun --nproc_per_node=2``: with no GPU, ``Accelerator()`` sees the
launcher's variables, picks MULTI_CPU with the gloo backend and wraps the model in
DDP on ``prepare``. ``--delay-ms`` makes one sample of each batch sleep (a slow
disk), so a loader-bound run can be asserted; nothing is downloaded.
"""

from __future__ import annotations

import argparse
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

import gputop
from gputop.demos.teardown import exit_without_teardown

SEQUENCE_LENGTH = 32
VOCAB = 512


class SentencePairs(Dataset[dict[str, torch.Tensor]]):
    """Token ids of made-up sentence pairs with a label, as the GLUE MRPC set gives them once tokenized."""

    def __init__(self, delay_s: float, batch_size: int) -> None:
        self.delay_s = delay_s
        self.batch_size = batch_size

    def __len__(self) -> int:
        return 1 << 16

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.delay_s and index % self.batch_size == 0:
            time.sleep(self.delay_s)
        ids = torch.randint(1, VOCAB, (SEQUENCE_LENGTH,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "attention_mask": torch.ones(SEQUENCE_LENGTH, dtype=torch.long),
                "labels": torch.tensor(index % 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps, then stop")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="how long each batch's loading sleeps")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--cpu", action="store_true", help="as nlp_example's: without it, no GPU means no DDP")
    args = parser.parse_args()

    accelerator = Accelerator(cpu=args.cpu)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=SEQUENCE_LENGTH, num_labels=2)  # fmt: skip
    model = BertForSequenceClassification(config)
    train_dataloader = DataLoader(SentencePairs(args.delay_ms / 1000.0, args.batch_size), batch_size=args.batch_size)
    optimizer = torch.optim.AdamW(params=model.parameters(), lr=2e-5)
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=10, num_training_steps=args.steps)
    model, optimizer, train_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, lr_scheduler
    )
    gputop.watch(model)
    print(f"rank {accelerator.process_index} {accelerator.distributed_type} {type(model).__name__}", flush=True)
    model.train()
    steps = 0
    for batch in gputop.track(train_dataloader):
        outputs = model(**batch)
        accelerator.backward(outputs.loss)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        steps += 1
        if steps == args.steps:
            break
    print(f"rank {accelerator.process_index} steps {steps}", flush=True)
    accelerator.wait_for_everyone()  # no rank tears gloo down while another is still in a collective
    accelerator.end_training()


if __name__ == "__main__":
    main()
    exit_without_teardown()  # gloo aborts now and then in the interpreter's teardown
