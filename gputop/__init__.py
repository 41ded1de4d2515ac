"""gputop: see why your GPUs sit idle.

In a training script::

    import gputop
    gputop.watch(model)                   # start reporting; hooks DDP and optimizer steps
    for batch in gputop.track(loader):    # time spent waiting for each batch
        ...

Then run ``gputop`` in another terminal.  Importing this package is cheap: the
reporter imports torch lazily and never imports the dashboard.
"""

from __future__ import annotations

__version__ = "0.1.0"

from gputop.reporter import step, track, watch

__all__ = ["__version__", "step", "track", "watch"]
