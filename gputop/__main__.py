"""``python -m gputop`` is the ``gputop`` command."""

from gputop.cli import main

raise SystemExit(main())
