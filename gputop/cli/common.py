"""What every command shares: the one-line errors, the listening address, the recorder, the exporter, SIGTERM."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from gputop.address import Address, resolve

if TYPE_CHECKING:
    from gputop.collect.recording import Recorder
    from gputop.export.prometheus import PrometheusExporter
    from gputop.model.source import SnapshotSource

EXIT_ERROR = 1

EXIT_USAGE = 2


class UserError(Exception):
    """Something the user can fix; printed as one line."""


class UsageError(UserError):
    """A combination of options that cannot work; one line, exit 2 like argparse's."""


def listen_address(args: argparse.Namespace) -> Address:
    """Where to listen; a network-facing listener without a token is a usage error."""
    from gputop.auth import Security, is_loopback

    address = resolve(args.port, args.socket, listen=args.listen)
    if address.is_tcp and not is_loopback(address.host) and not Security.from_env().token:
        raise UsageError(
            f"--listen {address.host}:{address.port} is reachable from the network: "
            "set GPUTOP_TOKEN (the same value in every rank's environment)"
        )
    return address


def start_prometheus(args: argparse.Namespace, source: SnapshotSource) -> PrometheusExporter | None:
    """The Prometheus endpoint over the source's snapshots, started; None when not asked for."""
    if not args.prometheus:
        return None
    from gputop.address import parse_host_port
    from gputop.export.prometheus import ExporterError, PrometheusExporter

    where = parse_host_port(args.prometheus, "--prometheus")
    assert where.port is not None
    exporter = PrometheusExporter(source.snapshot, where.host, where.port)
    try:
        exporter.start()
    except ExporterError as exc:
        raise UserError(str(exc)) from None
    return exporter


def log_to_stderr() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("gputop: %(message)s"))
    logger = logging.getLogger("gputop")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def open_recorder(path: Path, *, source: str, merge_after_s: float | None = None, merge_s: float = 10.0) -> Recorder:
    from gputop.collect.recording import Recorder, RecordingError

    try:
        return Recorder(path, source=source, merge_after_s=merge_after_s, merge_s=merge_s)
    except RecordingError as exc:
        raise UserError(str(exc)) from None


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within: SIGTERM stops like Ctrl-C, so a recording is closed whole and a collector's socket removed.

    What a scheduler, ``kill`` or a container's stop sends is SIGTERM, and Python
    dies of it on the spot: the merged windows not yet written and, in a ``.gz``
    recording, the last seconds and the stream's end were lost, and the summary
    never said what was written. (A shell's background job also ignores SIGINT.)
    """

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
