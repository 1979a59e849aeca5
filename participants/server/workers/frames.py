"""The frames between a server's worker coordinator and its workers, on a local Unix socket.

A frame is a 4-byte big-endian length, then that many bytes of msgpack: a ``Message``
(``{id, kind, body}``, plus the caller's ``traceparent``) or a ``Reply`` (``{reply_to, ok,
body | error}``). A frame over ``max_frame`` bytes, a truncated one, or one that does not
decode raises ``WorkerChannelError``; the channel that read it treats its peer as lost.
"""

from __future__ import annotations

import struct
from typing import Any, Final

import anyio
import msgspec
from anyio.abc import ByteReceiveStream

from ckpt_events.participants.errors import WorkerChannelError

__all__ = [
    "DEFAULT_MAX_FRAME",
    "Frame",
    "FrameError",
    "Message",
    "Reply",
    "decode_frame",
    "encode_frame",
    "read_frame",
]

#: The default bound on one frame's payload (a commit's records of one worker travel in one).
DEFAULT_MAX_FRAME: Final = 256 * 1024 * 1024
_HEADER: Final = struct.Struct(">I")


class FrameError(msgspec.Struct, forbid_unknown_fields=True):
    """Why a message was refused: the HTTP ``status`` and protocol ``code`` to answer with."""

    status: int
    code: str
    detail: str


class Message(msgspec.Struct, tag="m", tag_field="t", forbid_unknown_fields=True):
    """A request: ``id`` (unique per sender and connection), ``kind`` and its ``body``."""

    id: int
    kind: str
    body: Any = None
    traceparent: str | None = None


class Reply(msgspec.Struct, tag="r", tag_field="t", forbid_unknown_fields=True):
    """The answer to message ``reply_to``: ``body`` when ``ok``, else ``error``."""

    reply_to: int
    ok: bool
    body: Any = None
    error: FrameError | None = None


Frame = Message | Reply
_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(Frame)


def encode_frame(frame: Frame, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """The bytes of ``frame`` on the wire; raises ``WorkerChannelError`` if it is over the bound."""
    payload = _encoder.encode(frame)
    if len(payload) > max_frame:
        raise WorkerChannelError(f"frame of {len(payload)} bytes is over the bound of {max_frame}")
    return _HEADER.pack(len(payload)) + payload


def decode_frame(payload: bytes) -> Frame:
    """One frame's payload (without its length); raises ``WorkerChannelError`` if it does not decode."""
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise WorkerChannelError(f"undecodable frame: {exc}") from None


async def _read_exactly(stream: ByteReceiveStream, size: int, buffer: bytearray) -> bool:
    """Fill ``buffer`` up to ``size`` bytes; false on a clean end of stream before any byte."""
    while len(buffer) < size:
        try:
            chunk = await stream.receive(size - len(buffer))
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            if not buffer:
                return False
            raise WorkerChannelError(
                f"truncated frame: stream ended after {len(buffer)} of {size} bytes"
            ) from None
        buffer.extend(chunk)
    return True


async def read_frame(stream: ByteReceiveStream, max_frame: int = DEFAULT_MAX_FRAME) -> Frame | None:
    """The next frame, or None at a clean end of stream; ``WorkerChannelError`` on a bad one."""
    header = bytearray()
    if not await _read_exactly(stream, _HEADER.size, header):
        return None
    (size,) = _HEADER.unpack(header)
    if size > max_frame:
        raise WorkerChannelError(f"frame of {size} bytes is over the bound of {max_frame}")
    payload = bytearray()
    if size and not await _read_exactly(stream, size, payload):
        raise WorkerChannelError(f"truncated frame: stream ended after 0 of {size} bytes")
    return decode_frame(bytes(payload))
