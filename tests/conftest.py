"""Fixtures every tier can ask for: real collectors on free loopback ports.  Helpers live in tests/support."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gputop import auth
from gputop.address import Address
from gputop.collect.server import Collector
from gputop.collect.store import Store
from tests.support.collectors import TOKEN


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
