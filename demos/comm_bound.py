"""Scenario `comm_bound` (see gputop/demos/train.py).

Run: torchrun --nproc_per_node=2 demos/comm_bound.py --seconds 30
"""

import sys

from gputop.demos.train import main

raise SystemExit(main(["--scenario", "comm_bound", *sys.argv[1:]]))
