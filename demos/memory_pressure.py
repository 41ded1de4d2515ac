"""Scenario `memory_pressure` (see gputop/demos/train.py).

Run: torchrun --nproc_per_node=2 demos/memory_pressure.py --seconds 30
"""

import sys

from gputop.demos.train import main

raise SystemExit(main(["--scenario", "memory_pressure", *sys.argv[1:]]))
