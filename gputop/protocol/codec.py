"""Frames to messages and back: one typed decode parses and checks; a bad frame is one clear ProtocolError."""

from __future__ import annotations

import re
from typing import Any, TypeVar, Union

import msgspec

from gputop.protocol.commands import Command
from gputop.protocol.diagnostics import CaptureResult, Stacks
from gputop.protocol.limits import MAX_FRAME_BYTES, PROTOCOL_VERSION, ProtocolError
from gputop.protocol.node import Gpus
from gputop.protocol.run import Bye, Event, Hello, Window

Message = Union[Hello, Window, Event, Bye, CaptureResult, Stacks]  # noqa: UP007 - a runtime alias, Python 3.10 too
MESSAGE_TYPES: tuple[type[Message], ...] = (Hello, Window, Event, Bye, CaptureResult, Stacks)

# What a connection may send upstream: a rank's messages, or a node sampler's readings.
Upstream = Union[Hello, Window, Event, Bye, CaptureResult, Stacks, Gpus]  # noqa: UP007 - a runtime alias


class _Head(msgspec.Struct):
    """Just the version: a frame of another version is named as such, whatever its fields."""

    v: Any = PROTOCOL_VERSION


T = TypeVar("T")

# Annotated: msgspec's stubs type a Decoder of a class, and of a Union only as Decoder[Any].
_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[Message] = msgspec.json.Decoder(Message)
_upstream_decoder: msgspec.json.Decoder[Upstream] = msgspec.json.Decoder(Upstream)
_command_decoder: msgspec.json.Decoder[Command] = msgspec.json.Decoder(Command)
_head_decoder = msgspec.json.Decoder(_Head)
_VERSION_PREFIX = b'{"v":%d,' % PROTOCOL_VERSION


def to_dict(message: Message) -> dict[str, Any]:
    """The JSON object for a message; None fields and defaults are left out (N/A)."""
    return {"v": PROTOCOL_VERSION, **msgspec.to_builtins(message)}


def encode(message: Message | Gpus | Command) -> bytes:
    """One frame: compact JSON, ``v`` first, and a newline."""
    return _VERSION_PREFIX + _encoder.encode(message)[1:] + b"\n"


def decode(frame: bytes | str) -> Message:
    """Parse and check one frame; raise ProtocolError saying what is wrong with it."""
    return _decode_with(_decoder, frame)


def decode_upstream(frame: bytes | str) -> Upstream:
    """Parse and check one frame a connection sent the collector: a rank's message or a host's GPUs."""
    return _decode_with(_upstream_decoder, frame)


def _decode_with(decoder: msgspec.json.Decoder[T], frame: bytes | str) -> T:
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    try:
        return decoder.decode(frame)
    except msgspec.ValidationError as exc:
        try:
            version = _head_decoder.decode(frame).v
        except msgspec.MsgspecError:
            version = PROTOCOL_VERSION
        raise ProtocolError(_reason(exc, version)) from None
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"not JSON: {exc}{_near(frame, str(exc))}") from None


def decode_command(frame: bytes | str) -> Command:
    """Parse and check one command frame (collector to reporter); raise ProtocolError if it is not one."""
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    try:
        return _command_decoder.decode(frame)
    except msgspec.ValidationError as exc:
        raise ProtocolError(_reason(exc, PROTOCOL_VERSION)) from None
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"not JSON: {exc}") from None


def from_dict(obj: object) -> Message:
    """A message from an already parsed JSON object (a recording's line), checked like a frame."""
    try:
        message: Message = msgspec.convert(obj, Message, str_keys=True)  # Any in the stubs, for a Union
        return message
    except msgspec.ValidationError as exc:
        raise ProtocolError(_reason(exc, obj.get("v", PROTOCOL_VERSION) if isinstance(obj, dict) else None)) from None


def _near(frame: bytes | str, error: str) -> str:
    """Which field the malformed byte is in ("t1" for ``"t1":NaN``), from msgspec's byte offset."""
    match = re.search(r"\(byte (\d+)\)", error)
    data = frame.encode(errors="replace") if isinstance(frame, str) else frame
    if match is None:
        return ""
    keys = re.findall(rb'"([A-Za-z_][A-Za-z0-9_]*)"\s*:', data[: int(match.group(1))])
    return f", in field {keys[-1].decode()}" if keys else ""


def _reason(exc: msgspec.ValidationError, version: object) -> str:
    """msgspec's message in this protocol's words where they differ."""
    if version != PROTOCOL_VERSION:
        return f"protocol version {version!r}, expected {PROTOCOL_VERSION}"
    text = str(exc)
    bound = re.match(r"Expected `\w+` >= (\d)[.0]* - at `\$\.(\w+)`", text)
    if bound is not None:
        return (
            f"{bound.group(2)} must not be negative"
            if bound.group(1) == "0"
            else f"{bound.group(2)} must be at least 1"
        )
    if text.startswith("Expected `object`"):
        return "a frame must be a JSON object"
    if "at `$.type`" in text:
        return f"unknown message type: {text}"
    return text
