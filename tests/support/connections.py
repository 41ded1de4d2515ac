"""A collector connection without a socket: a transport that keeps what is written, reads fed as the loop feeds them."""

from __future__ import annotations

import asyncio
from typing import Any

from gputop.collect.connection import READ_BUFFER_BYTES, Connection


class KeptTransport(asyncio.Transport):
    """A transport without a socket: what the collector writes is kept, closing is noted."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass


def feed(connection: Connection, *reads: bytes) -> None:
    """Each read as the selector loop hands it over: into the buffer the protocol lends, then its length."""
    for data in reads:
        assert len(data) <= READ_BUFFER_BYTES
        buffer = connection.get_buffer(-1)
        buffer[: len(data)] = data
        connection.buffer_updated(len(data))
