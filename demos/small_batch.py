"""Scenario `small_batch` (see gputop/demos/train.py).

Run: torchrun --nproc_per_node=2 demos/small_batch.py --seconds 30
"""

import sys

from gputop.demos.train import main

raise SystemExit(main(["--scenario", "small_batch", *sys.argv[1:]]))
