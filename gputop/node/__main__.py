"""``python -m gputop.node``: see ``gputop.node.sampler``."""

from __future__ import annotations

import sys

from gputop.node.sampler import main

sys.exit(main())
