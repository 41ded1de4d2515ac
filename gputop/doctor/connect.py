"""Where reporters connect: the per-user socket, and the collector the environment points them at."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Mapping
from typing import Any, NamedTuple

from gputop import auth, settings
from gputop.address import LOOPBACK, Address, AddressError, default_socket_path, private_dir_problem, resolve
from gputop.doctor.checks import (
    COLLECTOR,
    SOCKET,
    Check,
)

CONNECT_TIMEOUT_S = 1.0
WHERE = (settings.PORT, settings.ADDR, settings.SOCKET)  # the order gputop.address.resolve takes them in


def check_socket(env: Mapping[str, str]) -> Check:
    """The per-user socket a dashboard listens on by default: its folder's safety, and who listens."""
    path = default_socket_path(env)
    folder = path.parent
    facts: dict[str, Any] = {"path": str(path), "folder_exists": folder.is_dir(), "listening": False}
    if not folder.is_dir():
        return Check(
            SOCKET,
            "note",
            f"{folder} not there yet: no dashboard has run as this user",
            fix="start `gputop`",
            facts=facts,
        )
    info = folder.stat()
    facts.update(folder_mode=f"{stat.S_IMODE(info.st_mode):04o}", folder_uid=info.st_uid)
    problem = private_dir_problem(folder)
    if problem is not None:
        # Reporters refuse such a folder, so nothing reaches a dashboard through it.  A mode problem's
        # message already says to chmod; another user's folder is theirs to remove.
        fix = "" if info.st_uid == os.getuid() else "have it removed, or set XDG_RUNTIME_DIR to a folder of yours"
        return Check(SOCKET, "problem", problem, fix=fix, facts=facts)
    where = f"{path} (folder {facts['folder_mode']}, yours)"
    answer = knock(Address(path=path))
    facts["listening"] = answer.listening
    if answer.listening:
        return Check(SOCKET, "ok", f"a dashboard or recorder is listening at {where}", facts=facts)
    return Check(SOCKET, "note", f"{where}: {answer.why}", fix="start `gputop` to see runs", facts=facts)


def check_collector(env: Mapping[str, str]) -> Check:
    """The collector GPUTOP_ADDR / GPUTOP_PORT / GPUTOP_SOCKET point reporters at, tried as a reporter would."""
    chosen = [s.env for s in WHERE if env.get(s.env)]  # set, even to a bad value: resolve() says what is wrong
    if not chosen:
        summary = f"{', '.join(s.env for s in WHERE)} not set: reporters use the socket above"
        return Check(COLLECTOR, "note", summary, facts={"set": []})
    try:
        address = resolve(env=env)
    except AddressError as exc:
        return Check(COLLECTOR, "problem", str(exc), fix="correct it", facts={"set": chosen})
    # resolve() takes the first of these that is set; say so when several are.
    details = (f"{chosen[0]} wins over {', '.join(chosen[1:])}",) if len(chosen) > 1 else ()
    answer = handshake(address, auth.Security.from_env(env)) if address.is_tcp else knock(address)
    facts = {"set": chosen, "address": str(address), "listening": answer.listening, "error": answer.why}
    if answer.why is None:
        summary = f"{chosen[0]}: a collector is listening at {address}"
        return Check(COLLECTOR, "ok", summary, details=details, facts=facts)
    fix = answer.fix or f"start `gputop {_listen_option(address)}` (or `gputop record`) there"
    summary = f"{chosen[0]}: {address}: {answer.why}"
    return Check(COLLECTOR, "problem", summary, fix=fix, details=details, facts=facts)


def _listen_option(address: Address) -> str:
    if not address.is_tcp:
        return f"--socket {address.path}"
    if address.host == LOOPBACK:
        return f"--port {address.port}"
    return f"--listen :{address.port}"


class Answer(NamedTuple):
    """What a connection attempt found: why it failed (None: it worked), whether anything listens, what to do."""

    why: str | None
    listening: bool
    fix: str = ""


def knock(address: Address) -> Answer:
    """Whether something accepts a connection on the Unix socket; a connect and nothing more."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT_S)
    try:
        sock.connect(str(address.path))
    except FileNotFoundError:
        return Answer("nothing listens (no socket there)", listening=False)
    except ConnectionRefusedError:
        return Answer("nothing listens (a socket file left by one that exited)", listening=False)
    except OSError as exc:
        return Answer(exc.strerror or str(exc), listening=False)
    finally:
        sock.close()
    return Answer(None, listening=True)


def handshake(address: Address, security: auth.Security) -> Answer:
    """Whether a collector at the TCP address admits this environment's token and TLS.

    A reporter's whole handshake, not a bare connect: a token collector counts a
    connection that hangs up at its challenge as a refusal, and only the
    handshake tells whether the token is right.
    """
    assert address.port is not None
    try:
        sock = socket.create_connection((address.host, address.port), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        return Answer(exc.strerror or str(exc) or type(exc).__name__, listening=False)
    try:
        sock, refusal = auth.secure_client(sock, security, address.host, str(address))
    except TimeoutError:
        return Answer("connected, but no gputop greeting within 1 s", True, fix="a TLS collector? set GPUTOP_TLS_CA")
    except auth.HandshakeError as exc:
        return Answer(f"something answers, but not gputop: {exc}", True, fix="check the address")
    except OSError as exc:  # TLS failures are OSErrors too
        return Answer(str(exc) or type(exc).__name__, True, fix="check GPUTOP_TLS_CA against the collector's")
    sock.close()
    if refusal:
        return Answer(refusal.removeprefix(f"{address} "), True, fix="GPUTOP_TOKEN here and the collector's must match")
    return Answer(None, listening=True)
