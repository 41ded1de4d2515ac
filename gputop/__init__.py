"""gputop: see why your GPUs sit idle.

In a training script::

    import gputop
    gputop.watch(model)                   # start reporting; hooks DDP and optimizer steps
    for batch in gputop.track(loader):    # time spent waiting for each batch
        ...
    gputop.log_to(summary_writer)         # optional: the step breakdown into TensorBoard

Then run ``gputop`` in another terminal.  Importing this package is cheap: the
reporter is loaded on first use of ``watch``/``track``/``step`` (so the
dashboard, which imports ``gputop.*`` too, never loads it); it imports torch
lazily and never imports the dashboard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["__version__", "figures", "log_to", "step", "track", "watch"]
_REPORTER_API = ("watch", "track", "step", "log_to", "figures")

if TYPE_CHECKING:
    from gputop.reporter import figures, log_to, step, track, watch


def __getattr__(name: str) -> Any:
    if name in _REPORTER_API:
        import gputop.reporter

        return getattr(gputop.reporter, name)
    raise AttributeError(f"module 'gputop' has no attribute {name!r}")
