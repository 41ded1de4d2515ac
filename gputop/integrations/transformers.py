"""Hugging Face Trainer: one callback instead of the two script lines.

    from gputop.integrations.transformers import GputopCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[GputopCallback()])

Every rank reports like a torchrun job: steps from ``optimizer.step()``, DDP's
timings from the DDP wrapper the Trainer (through Accelerate) puts around the
model, and loader wait.  The Trainer fetches each optimizer step's batches
(``gradient_accumulation_steps`` of them) between one step's end and the next
step's begin; that gap, after the step's logging, saving and evaluation have
ended, is counted as loader wait.  It also holds Accelerate's device transfer
and, for token-averaged losses, its small gather of token counts.

The rank's step breakdown (``gputop/rank<R>/loader_wait_pct``…) is added to
the Trainer's logs, so TensorBoard, W&B and every other ``report_to`` target
show it next to the loss.  The callbacks are given the unwrapped model, not the
Trainer, so the Trainer is found once, at the start of training, in the
caller's frames; if that ever fails the rank still reports, without DDP
figures.  Never raises into training; transformers is an optional extra
(``pip install 'gputop-train[transformers]'``).
"""

from __future__ import annotations

import contextlib
import sys
import time
from types import FrameType, SimpleNamespace
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

import gputop
from gputop.reporter import add_loader_wait

if TYPE_CHECKING:
    from gputop.reporter.reporter import Reporter

FRAMES_SEARCHED = 12  # the Trainer's frame is 3 to 4 up from a callback: CallbackHandler.call_event, on_train_begin


# misc: a subclass of Any where Transformers is not installed (`make check`); unused-ignore: where it is.
class GputopCallback(TrainerCallback):  # type: ignore[misc, unused-ignore]
    """Reports every rank of a Trainer run to gputop and adds its figures to the Trainer's logs."""

    def __init__(self, *, log_figures: bool = True) -> None:
        """Args: log_figures: add gputop's step breakdown to the Trainer's logs (default yes)."""
        self.log_figures = log_figures
        self._fetch_from_s: float | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        try:
            trainer = _calling_trainer()
            wrapped = getattr(trainer, "model_wrapped", None) if trainer is not None else None
            gputop.watch(wrapped if wrapped is not None else model)
            reporter = _reporter()
            if reporter is not None:
                reporter.attach_loader(_loader_settings(args))
            if trainer is not None and self.log_figures:
                _log_before_the_reporters(trainer, self)
        except Exception:
            pass

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._fetch_from_s = time.perf_counter()  # the epoch's first fetch (worker start-up) counts

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._fetch_from_s is not None:
            add_loader_wait(time.perf_counter() - self._fetch_from_s)
            self._fetch_from_s = None

    def _fetch_starts(self) -> None:
        self._fetch_from_s = time.perf_counter()

    # The next fetch starts after whichever of these the step ends with.
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._fetch_starts()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._fetch_from_s is not None:
            self._fetch_starts()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._fetch_from_s is not None:
            self._fetch_starts()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if self.log_figures and isinstance(logs, dict) and "loss" in logs:  # training logs, not eval ones
            with contextlib.suppress(Exception):
                logs.update(gputop.figures())
        if self._fetch_from_s is not None:
            self._fetch_starts()


def _loader_settings(args: Any) -> SimpleNamespace:
    """The DataLoader settings from the TrainingArguments that made it.

    Accelerate's prepared loader batches through a sharding sampler and no
    longer says its batch size; the arguments do.
    """
    return SimpleNamespace(
        batch_size=getattr(args, "per_device_train_batch_size", None),
        num_workers=getattr(args, "dataloader_num_workers", None),
        pin_memory=getattr(args, "dataloader_pin_memory", None),
        persistent_workers=getattr(args, "dataloader_persistent_workers", None),
        prefetch_factor=getattr(args, "dataloader_prefetch_factor", None),
    )


def _reporter() -> Reporter | None:
    from gputop.reporter import _get

    return _get()


def _calling_trainer() -> Any:
    """The Trainer whose callback handler is calling us: the first frame up whose ``self`` has ``model_wrapped``."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(FRAMES_SEARCHED):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if candidate is not None and hasattr(candidate, "model_wrapped") and hasattr(candidate, "callback_handler"):
            return candidate
        frame = frame.f_back
    return None


def _log_before_the_reporters(trainer: Any, callback: GputopCallback) -> None:
    """Put this callback first, so the figures it adds to ``logs`` reach TensorBoard, W&B… called after it.

    A new list, not an in-place move: the handler is iterating the old one right now.
    """
    handler = trainer.callback_handler
    handler.callbacks = [callback, *(c for c in handler.callbacks if c is not callback)]
