"""Scenario `rotating` (see gputop/demos/train.py).

Run: torchrun --nproc_per_node=2 demos/rotating.py --seconds 30
"""

import sys

from gputop.demos.train import main

raise SystemExit(main(["--scenario", "rotating", *sys.argv[1:]]))
