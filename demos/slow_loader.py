"""Scenario `slow_loader` (see gputop/demos/train.py).

Run: torchrun --nproc_per_node=2 demos/slow_loader.py --seconds 30
"""

import sys

from gputop.demos.train import main

raise SystemExit(main(["--scenario", "slow_loader", *sys.argv[1:]]))
