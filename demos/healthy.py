"""Scenario `healthy` (see gputop/demos/train.py).

Run: torchrun --nproc_per_node=2 demos/healthy.py --seconds 30
"""

import sys

from gputop.demos.train import main

raise SystemExit(main(["--scenario", "healthy", *sys.argv[1:]]))
