"""The node sampler's loop: sample this host's GPUs every second, send each sample upstream.

Its own process, so a blocking socket and a plain loop are fine here: nothing
trains in it.  The connection is the one a reporter opens (``gputop.address``
resolves ``GPUTOP_ADDR``/``GPUTOP_PORT``/``GPUTOP_SOCKET``; over TCP, TLS when
``GPUTOP_TLS_CA`` is set, then ``auth.client_handshake`` with ``GPUTOP_TOKEN``).
A lost connection is retried with backoff and the samples in between are
dropped: a GPU reading is only worth its freshness, and the collector's own
history holds the past.

Started by a rank (``--parent-pid``), it leaves the moment that rank's process
has exited, from a thread of its own (``gputop.processes.lifeline``), so it never outlives
the rank that carried it, whatever killed the rank and wherever its own main
thread is stuck (an NVML call, a blocked send, its teardown).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from types import FrameType

from gputop import auth, settings
from gputop.address import Address, AddressError, parse_host_port, resolve
from gputop.collect.gpu.sampler import GpuSampler
from gputop.model.samples import GpuSample, gpu_sample_to_wire
from gputop.processes import lifeline
from gputop.protocol import MAX_FRAME_BYTES, Gpus, encode

INTERVAL_S = 1.0
CONNECT_TIMEOUT_S = 2.0  # a remote collector: a round trip or two, plus TLS
SEND_TIMEOUT_S = 5.0  # a collector that takes no frame for this long is treated as gone
BACKOFF_MIN_S = 1.0
BACKOFF_MAX_S = 30.0
REFUSED_BACKOFF_S = 30.0  # a collector that refused the token will refuse it again soon
PROCESSES_DROPPED = "left out: the sample was over the frame limit"


class Link:
    """A blocking connection to the collector that reconnects with backoff; ``send`` never raises."""

    def __init__(
        self, address: Address, security: auth.Security, *, say: Callable[[str], None], say_unreachable: bool = False
    ) -> None:
        """``say_unreachable``: say once that the collector cannot be reached (an agent started by hand;
        a rank's child keeps quiet, as the rank's reporter does while a dashboard is not up yet)."""
        self.address = address
        self.security = security
        self._say = say
        self._say_unreachable = say_unreachable
        self._unreachable_said = False
        self._sock: socket.socket | None = None
        self._next_attempt_s = 0.0
        self._backoff_s = BACKOFF_MIN_S
        self._refusal = ""  # the last refusal said, so it is said once and not every minute
        self.sent_frames = 0

    def send(self, frame: bytes, now_s: float) -> bool:
        """Send one frame, connecting first if due; False when it could not go (it is dropped)."""
        if self._sock is None and (now_s < self._next_attempt_s or not self._connect(now_s)):
            return False
        assert self._sock is not None
        try:
            self._sock.sendall(frame)
        except OSError:
            self.close()
            self._next_attempt_s = now_s + self._backoff_s
            return False
        self.sent_frames += 1
        return True

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
        self._sock = None

    def _connect(self, now_s: float) -> bool:
        try:
            sock = self._open()
        except OSError as exc:
            self._unreachable(exc)
            self._next_attempt_s = now_s + self._backoff_s
            self._backoff_s = min(self._backoff_s * 2, BACKOFF_MAX_S)
            return False
        self._sock = sock
        self._backoff_s = BACKOFF_MIN_S
        self._refusal = ""
        if self._unreachable_said:
            self._unreachable_said = False
            self._say(f"connected to {self.address}")
        return True

    def _unreachable(self, exc: OSError) -> None:
        if self._say_unreachable and not self._unreachable_said and not self._refusal:
            self._unreachable_said = True
            self._say(f"cannot reach {self.address} ({exc.strerror or exc}); retrying")

    def _open(self) -> socket.socket:
        if not self.address.is_tcp:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(SEND_TIMEOUT_S)
            try:
                sock.connect(str(self.address.path))
            except OSError:
                sock.close()
                raise
            return sock
        sock = socket.create_connection(self.address.tcp_endpoint, timeout=CONNECT_TIMEOUT_S)
        try:
            sock, refusal = auth.secure_client(sock, self.security, self.address.host, str(self.address))
        except auth.HandshakeError as exc:
            refusal = f"{self.address} is not a gputop collector that speaks this version ({exc})"
        if refusal:
            sock.close()
            if refusal != self._refusal:
                self._refusal = refusal
                self._say(f"not sending GPU readings: {refusal}")
            self._backoff_s = REFUSED_BACKOFF_S
            raise ConnectionRefusedError(refusal)
        sock.settimeout(SEND_TIMEOUT_S)
        return sock


def gpus_frame(sample: GpuSample, hostname: str) -> bytes:
    """One ``gpus`` frame; a sample too big for a frame goes without its per-process lists."""
    frame = encode(Gpus(hostname=hostname, t=sample.t, sample=gpu_sample_to_wire(sample)))
    if len(frame) <= MAX_FRAME_BYTES:
        return frame
    slim = replace(
        sample,
        gpus=tuple(replace(g, processes=(), na={**g.na, "processes": PROCESSES_DROPPED}) for g in sample.gpus),
    )
    return encode(Gpus(hostname=hostname, t=sample.t, sample=gpu_sample_to_wire(slim)))


def run(
    link: Link,
    sampler: GpuSampler,
    hostname: str,
    *,
    interval_s: float = INTERVAL_S,
    stop: threading.Event | None = None,
) -> None:
    """Sample and send every ``interval_s`` until ``stop`` is set."""
    stop = stop if stop is not None else threading.Event()
    next_s = time.monotonic()
    try:
        while not stop.is_set():
            sample = sampler.sample()
            link.send(gpus_frame(sample, hostname), time.monotonic())
            next_s += interval_s
            delay_s = next_s - time.monotonic()
            if delay_s < 0:  # suspended, or a slow NVML: keep the pace, don't burst
                next_s, delay_s = time.monotonic(), 0.0
            stop.wait(delay_s)
    finally:
        link.close()
        sampler.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gputop agent",
        description="Send this host's GPU readings (NVML) to a gputop dashboard or recorder on another machine.",
    )
    parser.add_argument(
        "--addr", metavar="HOST:PORT", default=None,
        help="the collector (default: GPUTOP_ADDR, GPUTOP_PORT or the local socket, as reporters resolve it)",
    )  # fmt: skip
    parser.add_argument("--interval", type=float, default=INTERVAL_S, metavar="S", help="seconds between samples")
    parser.add_argument(
        "--hostname", default=None,
        help="the host name the ranks here report (default: this machine's; a DaemonSet pod sets its node's)",
    )  # fmt: skip
    parser.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)  # set by a rank
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.interval <= 0:
        print("gputop agent: --interval must be positive", file=sys.stderr)
        return 2
    if args.parent_pid is not None and not lifeline.leave_with(args.parent_pid):
        return 0  # the rank is gone already
    try:
        address = parse_host_port(args.addr, "--addr") if args.addr else resolve()
    except AddressError as exc:
        print(f"gputop agent: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def say(line: str) -> None:
        print(f"gputop agent: {line}", file=sys.stderr, flush=True)

    link = Link(address, auth.Security.from_env(), say=say, say_unreachable=args.parent_pid is None)
    hostname = args.hostname or settings.NODE_HOSTNAME.value() or socket.gethostname()
    run(link, GpuSampler(), hostname, interval_s=args.interval, stop=stop)
    return 0
