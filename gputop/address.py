"""Where the dashboard listens and reporters connect: one rule for both sides.

Default: a per-user Unix socket in a folder only that user can enter
(``$XDG_RUNTIME_DIR/gputop/gputop.sock``, else ``/tmp/gputop-<uid>/gputop.sock``),
so other users of a shared GPU server can neither read the telemetry nor feed
the dashboard.  ``GPUTOP_PORT=N`` (reporter) / ``--port N`` (dashboard) switch
to TCP on 127.0.0.1; ``GPUTOP_SOCKET=PATH`` / ``--socket PATH`` pick another
Unix socket.  ``GPUTOP_ADDR=HOST:PORT`` (reporter) / ``--listen ADDR:PORT``
(dashboard, recorder) reach across machines over TCP; a listener that is not
on loopback needs ``GPUTOP_TOKEN`` (see ``gputop.auth``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gputop import settings

LOOPBACK = "127.0.0.1"


class AddressError(Exception):
    """An address that cannot be used; the message is one line for the user."""


@dataclass(frozen=True)
class Address:
    """A Unix socket path or a loopback TCP port."""

    path: Path | None = None
    port: int | None = None
    host: str = LOOPBACK

    @property
    def is_tcp(self) -> bool:
        return self.port is not None

    @property
    def tcp_endpoint(self) -> tuple[str, int]:
        """(host, port) for ``socket.create_connection``; ValueError for a Unix socket."""
        if self.port is None:
            raise ValueError(f"{self} is not a TCP address")
        return self.host, self.port

    def __str__(self) -> str:
        return f"tcp://{self.host}:{self.port}" if self.is_tcp else f"unix://{self.path}"


def default_socket_path(env: Mapping[str, str] = os.environ) -> Path:
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "gputop" / "gputop.sock"
    return Path(f"/tmp/gputop-{os.getuid()}") / "gputop.sock"


def parse_host_port(text: str, what: str) -> Address:
    """``HOST:PORT`` or ``[V6]:PORT`` (``:PORT`` alone means every interface) as a TCP address."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise AddressError(f"{what}={text!r} is not HOST:PORT")
    host = host.strip("[]") or "0.0.0.0"
    return Address(host=host, port=_check_port(int(port_text)))


def resolve(
    port: int | None = None,
    socket_path: str | None = None,
    env: Mapping[str, str] = os.environ,
    *,
    listen: str | None = None,
) -> Address:
    """The address from explicit options, else the environment, else the default socket."""
    if listen:
        return parse_host_port(listen, "--listen")
    if port is not None:
        return Address(port=_check_port(port))
    if socket_path:
        return Address(path=Path(socket_path))
    try:
        port = settings.PORT.value(env)
    except settings.SettingError as exc:
        raise AddressError(str(exc)) from None
    if port is not None:
        return Address(port=port)
    addr = settings.ADDR.value(env)
    if addr:
        return parse_host_port(addr, settings.ADDR.env)
    return Address(path=settings.SOCKET.value(env) or default_socket_path(env))


def _check_port(port: int) -> int:
    if not 1 <= port <= 65535:
        raise AddressError(f"port {port} is outside 1-65535")
    return port


def private_dir_problem(folder: Path) -> str | None:
    """Why an existing socket folder must not be used (another user's, or readable by others), or None."""
    try:
        info = folder.stat()
    except OSError as exc:
        return f"cannot read {folder}: {exc.strerror}"
    if info.st_uid != os.getuid():
        return f"{folder} belongs to uid {info.st_uid}, not you; refusing to use it"
    if stat.S_IMODE(info.st_mode) & 0o077:
        return f"{folder} is readable by other users (mode {stat.S_IMODE(info.st_mode):o}); chmod 700 it"
    return None


def ensure_private_dir(folder: Path) -> None:
    """Create the socket's folder as 0700, or check that an existing one is ours and private."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise AddressError(f"cannot create {folder}: {exc.strerror}") from None
    problem = private_dir_problem(folder)
    if problem:
        raise AddressError(problem)
