"""Fixtures every tier can ask for: real collectors on free loopback ports.  Helpers live in tests/support."""

from __future__ import annotations

import gc
import signal
from collections.abc import Iterator

import pytest

from gputop import auth
from gputop.address import Address
from gputop.collect.server import Collector
from gputop.collect.store import Store
from tests.support.collectors import TOKEN

# A suite started in the background of a non-interactive shell (`cmd &` in a script, CI runners) inherits
# SIGINT ignored, and so would every `gputop record`/`demo` the tests start and then stop with Ctrl-C's signal:
# they would never hear it.  Handled here, the children start with SIGINT's default again (exec resets handlers,
# not ignores).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Everything imported by now (pytest, Textual, torch where there is torch, every test module) lives as long as
    the process: frozen, the garbage collector stops walking it.  The walk was most of a worker's last seconds: pytest
    collects five times over at the end, ~0.5 s each, and a pytest-xdist worker busy for 5 s after the run is told to
    stop with a SIGINT of its own (execnet), which on a loaded machine landed as a KeyboardInterrupt in whatever the
    worker was running."""
    gc.freeze()


@pytest.fixture
def guarded() -> Iterator[Collector]:
    """A real collector on loopback that demands TOKEN."""
    c = Collector(Store(), Address(port=0), security=auth.Security(token=TOKEN))
    c.start()
    yield c
    c.stop()


@pytest.fixture
def collector() -> Iterator[Collector]:
    """A real collector on a free loopback port."""
    c = Collector(Store(), Address(port=0))
    c.start()
    yield c
    c.stop()
