"""Proving a shared token over TCP without sending it: the HMAC challenge-response.

Pure functions and the handshake's frame types, and the connecting side's
exchange on a blocking socket (``client_handshake``: the reporter's sender and
``gputop capture`` run it); the collector's side is in the collector.  One exchange per TCP connection, before any
telemetry:

    collector -> reporter   {"type":"challenge","nonce":Nc,"token":true}
    reporter  -> collector  {"type":"auth","nonce":Nr,"mac":HMAC(token, "reporter"|Nc|Nr)}
    collector -> reporter   {"type":"welcome","mac":HMAC(token, "collector"|Nc|Nr)}
                         or {"type":"refused","reason":"wrong token"}

Both sides prove the token: the reporter's proof lets it in, the collector's
proof tells the reporter its telemetry goes to the holder of the token and not
to whoever answered on that port.  Only random nonces and MACs cross the wire;
the role in each MAC keeps one side's proof from being replayed as the other's.
A collector without a token sends ``"token": false`` and reads frames at once.
Confidentiality of the telemetry itself is TLS's job (certificate and key paths).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec

from gputop import settings

NONCE_BYTES = 16
MAX_HANDSHAKE_LINE_BYTES = 1024  # a frame of the handshake is under 200 bytes
_DOMAIN = b"gputop-auth-v1"


class HandshakeError(Exception):
    """A handshake frame that is not what the other side had to send; one line."""


class Challenge(msgspec.Struct, frozen=True, tag_field="type", tag="challenge"):
    nonce: str
    token: bool


class Auth(msgspec.Struct, frozen=True, tag_field="type", tag="auth"):
    nonce: str
    mac: str


class Welcome(msgspec.Struct, frozen=True, tag_field="type", tag="welcome"):
    mac: str


class Refused(msgspec.Struct, frozen=True, tag_field="type", tag="refused"):
    reason: str


HandshakeFrame = Challenge | Auth | Welcome | Refused
_decoder: msgspec.json.Decoder[HandshakeFrame] = msgspec.json.Decoder(HandshakeFrame)  # a Union: Any in the stubs


def encode_frame(frame: HandshakeFrame) -> bytes:
    return msgspec.json.encode(frame) + b"\n"


def decode_frame(line: bytes) -> HandshakeFrame:
    if len(line) > MAX_HANDSHAKE_LINE_BYTES:
        raise HandshakeError("handshake frame too long")
    try:
        return _decoder.decode(line.strip())
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise HandshakeError(f"not a gputop handshake ({exc})") from None


def new_nonce() -> str:
    return secrets.token_hex(NONCE_BYTES)


def mac(token: str, role: str, collector_nonce: str, reporter_nonce: str) -> str:
    """HMAC-SHA256 of the role and both nonces under the token, hex."""
    message = b"|".join((_DOMAIN, role.encode(), collector_nonce.encode(), reporter_nonce.encode()))
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def verify(token: str, role: str, collector_nonce: str, reporter_nonce: str, claimed: str) -> bool:
    """Whether ``claimed`` is the MAC for this role; constant-time compare."""
    return hmac.compare_digest(mac(token, role, collector_nonce, reporter_nonce), claimed)


def answer(challenge: Challenge, token: str) -> Auth:
    """The reporter's reply to a challenge."""
    nonce = new_nonce()
    return Auth(nonce=nonce, mac=mac(token, "reporter", challenge.nonce, nonce))


@dataclass(frozen=True)
class Security:
    """What secures a TCP connection: the shared token and TLS files, from the environment."""

    token: str = ""
    tls_cert: str = ""  # collector: its certificate chain (PEM)
    tls_key: str = ""  # collector: its private key (PEM)
    tls_ca: str = ""  # reporter: the CA that signed the collector's certificate; "system" for the default store

    @property
    def tls_server(self) -> bool:
        return bool(self.tls_cert)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Security:
        return cls(
            token=settings.TOKEN.value(env),
            tls_cert=settings.TLS_CERT.value(env),
            tls_key=settings.TLS_KEY.value(env),
            tls_ca=settings.TLS_CA.value(env),
        )


def is_loopback(host: str) -> bool:
    """Whether a listener on ``host`` is reachable from this machine only."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def _read_line(sock: socket.socket) -> bytes:
    """One handshake line, read a byte at a time so no telemetry-side byte is consumed."""
    line = bytearray()
    while len(line) <= MAX_HANDSHAKE_LINE_BYTES:
        byte = sock.recv(1)
        if not byte:
            raise ConnectionResetError("collector closed the connection during the handshake")
        if byte == b"\n":
            return bytes(line)
        line += byte
    raise HandshakeError("handshake frame too long")


def secure_client(sock: socket.socket, security: Security, host: str, where: str) -> tuple[socket.socket, str]:
    """A fresh TCP connection to a collector: TLS when ``security.tls_ca`` is set, then the token handshake.

    Returns the socket (wrapped when TLS) and "" when admitted, else the reason
    to print.  Raises HandshakeError when what answers is not a collector and
    OSError from the socket; either way the socket is closed.
    """
    try:
        if security.tls_ca:
            import ssl  # only clients that use TLS pay for loading it

            cafile = None if security.tls_ca == "system" else security.tls_ca
            sock = ssl.create_default_context(cafile=cafile).wrap_socket(sock, server_hostname=host)
        return sock, client_handshake(sock, security.token, where)
    except BaseException:
        sock.close()
        raise


def client_handshake(sock: socket.socket, token: str, where: str) -> str:
    """The connecting side of the handshake on a blocking socket (a reporter, `gputop capture`).

    "" when admitted, else the one-line reason to print.  Reads a byte at a
    time, so no byte after the handshake is consumed.
    """
    challenge = decode_frame(_read_line(sock))
    if not isinstance(challenge, Challenge):
        raise HandshakeError(f"expected a challenge, got {type(challenge).__name__.lower()}")
    if not challenge.token:
        if token:
            return f"{where} asks for no token but GPUTOP_TOKEN is set; start it with the same GPUTOP_TOKEN"
        return ""
    if not token:
        return f"{where} requires a token; set GPUTOP_TOKEN to the collector's"
    reply = answer(challenge, token)
    sock.sendall(encode_frame(reply))
    verdict = decode_frame(_read_line(sock))
    if isinstance(verdict, Refused):
        return f"{where} refused this connection: {verdict.reason}"
    if not isinstance(verdict, Welcome) or not verify(token, "collector", challenge.nonce, reply.nonce, verdict.mac):
        return f"{where} could not prove it holds GPUTOP_TOKEN; not sending it telemetry"
    return ""
