"""Frames on the worker socket: bad input is refused, never crashes the channel's owner."""

from __future__ import annotations

import struct

import anyio
import pytest

from ckpt_events.participants.errors import WorkerChannelError
from ckpt_events.participants.server.workers.frames import (
    Message,
    Reply,
    decode_frame,
    encode_frame,
    read_frame,
)

pytestmark = pytest.mark.anyio


class _Bytes:
    """A byte stream over ``data`` that ends after it (honours ``max_bytes`` like a socket)."""

    def __init__(self, data: bytes) -> None:
        self.data = bytearray(data)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self.data:
            raise anyio.EndOfStream
        chunk = bytes(self.data[:max_bytes])
        del self.data[:max_bytes]
        return chunk


async def _read(data: bytes, max_frame: int = 1024) -> object:
    return await read_frame(_Bytes(data), max_frame)  # type: ignore[arg-type]


async def test_a_message_and_a_reply_round_trip():
    """Encoded frames decode to the same message and reply."""
    message = Message(1, "export", {"scope": None}, "00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    assert await _read(encode_frame(message)) == message
    assert decode_frame(encode_frame(Reply(1, True, [1, 2]))[4:]) == Reply(1, True, [1, 2])


async def test_bad_frames_are_refused():
    """Over the bound, truncated, undecodable and unknown-shaped frames raise WorkerChannelError."""
    with pytest.raises(WorkerChannelError, match="over the bound"):
        encode_frame(Message(1, "x", "y" * 2000), max_frame=1024)
    with pytest.raises(WorkerChannelError, match="over the bound"):
        await _read(struct.pack(">I", 5000) + b"x")
    with pytest.raises(WorkerChannelError, match="truncated"):
        await _read(struct.pack(">I", 100) + b"x" * 10)
    with pytest.raises(WorkerChannelError, match="truncated"):
        await _read(b"\x00\x00")
    with pytest.raises(WorkerChannelError, match="undecodable"):
        await _read(struct.pack(">I", 3) + b"\xc1\xc1\xc1")
    with pytest.raises(WorkerChannelError, match="undecodable"):
        decode_frame(encode_frame(Message(1, "x"))[4:].replace(b"kind", b"kund"))
    assert await _read(b"") is None
