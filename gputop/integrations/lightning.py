"""PyTorch Lightning: one callback instead of the two script lines.

    import lightning as L
    from gputop.integrations.lightning import GputopCallback

    trainer = L.Trainer(..., callbacks=[GputopCallback()])

The callback watches the model Lightning trains: the strategy's wrapper where
it has one (DDP's, so DDP's timings are read; FSDP1's under ``FSDPStrategy``,
which Lightning allows on CUDA only), else the LightningModule itself
(``ModelParallelStrategy``, whose ``configure_model`` shards it with FSDP2's
``fully_shard``).  Lightning runs ``training_step`` through a wrapper's
``forward``, so the wrapper's hooks see each training forward; without one it
calls ``training_step`` directly and the module's hooks see none (unless the
step calls ``self(...)``).  The callback notices that on the first batch and
from then on marks each training forward itself, from the batch's start to
``on_before_backward``, so FSDP2's forward, backward and exposed
communication are timed as they are in a torchrun job (docs/communication.md).

It counts the time between the end of
one training batch and the start of the next as loader wait: Lightning fetches
the next batch there.  Validation inside an epoch is taken out of that gap.
What stays in it besides the fetch: Lightning's per-batch bookkeeping
(microseconds) and whatever other callbacks do after a batch, notably
``ModelCheckpoint(every_n_train_steps=...)`` saving, so on steps that save a
checkpoint the loader wait reads high.  Steps are
counted from ``optimizer.step()`` as everywhere else, so gradient accumulation
counts one step per optimizer step.  Every ``log_every_n_steps`` the rank's
step breakdown (``gputop/rank<R>/loader_wait_pct``…) goes to the trainer's
loggers (TensorBoard, W&B, CSV), next to the loss.  Works with ``lightning.pytorch`` or the
older ``pytorch_lightning`` package.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import gputop
from gputop.reporter import add_loader_wait

if TYPE_CHECKING:
    from gputop.reporter.reporter import Reporter

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the standalone package of Lightning 1.x/2.x
    from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef, assignment, unused-ignore]


# misc: a subclass of Any where Lightning is not installed (`make check`); unused-ignore: where it is.
class GputopCallback(Callback):  # type: ignore[misc, unused-ignore]
    """Reports every rank of a Lightning run to gputop.  Never raises into training."""

    def __init__(self, *, log_figures: bool = True) -> None:
        """Args: log_figures: log gputop's step breakdown to the trainer's loggers every ``log_every_n_steps``."""
        super().__init__()
        self.log_figures = log_figures
        self._batch_end_s: float | None = None
        self._comm_at_batch_end_s = 0.0  # the collectives' exposed time so far, at that batch end
        self._paused_s: float | None = None
        self._logged_step = -1
        # Whether the watched model's hooks miss the training forwards, so the callback marks them: None until
        # the first training batch tells, by the forwards the hooks counted between its start and its backward.
        self._marks_forwards: bool | None = None
        self._forwards_at_batch_start: int | None = None

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        try:
            model = getattr(getattr(trainer, "strategy", None), "model", None) or pl_module
            gputop.watch(model)
        except Exception:
            pass

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._batch_end_s = time.perf_counter()  # the first fetch of an epoch (worker start-up) counts
        self._comm_at_batch_end_s = _exposed_comm_s()
        try:
            reporter = _reporter()
            loader = _first_loader(getattr(trainer, "train_dataloader", None))
            if reporter is not None and loader is not None:
                reporter.attach_loader(loader)
        except Exception:
            pass

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if self._batch_end_s is not None:
            # From one batch's end to the next one's start, less the collectives the loop ran in between (the
            # strategy's per-batch broadcast): their exposed time is the exchange's, and counted there.
            between = _exposed_comm_s() - self._comm_at_batch_end_s
            add_loader_wait(max(time.perf_counter() - self._batch_end_s - between, 0.0))
            self._batch_end_s = None
        try:
            reporter = _reporter()
            if reporter is None:
                return
            if self._marks_forwards:
                reporter._on_forward(pl_module, (batch,))  # what the model's forward pre-hook does
            elif self._marks_forwards is None:
                self._forwards_at_batch_start = reporter.clock.forwards
        except Exception:
            pass

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        """The training step's forward has ended: its loss is about to be backpropagated."""
        try:
            reporter = _reporter()
            if reporter is None:
                return
            if self._marks_forwards:
                reporter._on_forward_done(pl_module, (), loss)  # what the model's forward hook does
            elif self._marks_forwards is None and self._forwards_at_batch_start is not None:
                self._marks_forwards = reporter.clock.forwards == self._forwards_at_batch_start
                if self._marks_forwards:  # count the first one too, timed from here (the first step has no time)
                    reporter._on_forward(pl_module, ())
                    reporter._on_forward_done(pl_module, (), loss)
        except Exception:
            pass

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.log_figures:
            self._log_figures(trainer)
        self._comm_at_batch_end_s = _exposed_comm_s()
        self._batch_end_s = time.perf_counter()

    def _log_figures(self, trainer: Any) -> None:
        """gputop's figures into every logger (rank-zero loggers write rank 0's), at the loss's cadence."""
        try:
            step = int(trainer.global_step)
            every = max(int(getattr(trainer, "log_every_n_steps", 50) or 50), 1)
            if step == self._logged_step or step % every or not trainer.loggers:
                return
            self._logged_step = step
            figures = gputop.figures()
            if figures:
                for logger in trainer.loggers:
                    logger.log_metrics(figures, step=step)
        except Exception:
            pass

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._paused_s = self._batch_end_s  # validation is not waiting for training data
        self._batch_end_s = None

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._paused_s is not None:
            self._batch_end_s = time.perf_counter()
            self._paused_s = None


def _reporter() -> Reporter | None:
    from gputop.reporter import _get

    return _get()


def _exposed_comm_s() -> float:
    """The exposed time of every collective this rank's clock has counted so far (0 without a reporter)."""
    try:
        reporter = _reporter()
        return float(reporter.clock.comm_exposed_s) if reporter is not None else 0.0
    except Exception:
        return 0.0


def _first_loader(loaders: Any) -> Any:
    """The DataLoader inside Lightning's CombinedLoader, a list, a dict, or itself."""
    inner = getattr(loaders, "iterables", loaders)
    if isinstance(inner, dict):
        inner = next(iter(inner.values()), None)
    if isinstance(inner, (list, tuple)):
        inner = inner[0] if inner else None
    return inner
