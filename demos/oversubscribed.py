"""Scenario `oversubscribed` (see gputop/demos/train.py).

Run: torchrun --nproc_per_node=2 demos/oversubscribed.py --seconds 30
"""

import sys

from gputop.demos.train import main

raise SystemExit(main(["--scenario", "oversubscribed", *sys.argv[1:]]))
