"""Frames on the worker socket: bad input is refused, never crashes the channel's owner."""

from __future__ import annotations

import struct
import typing
from typing import Any

import anyio
import msgspec
import pytest

from ckpt_events.participants.errors import WorkerChannelError
from ckpt_events.participants.protocol import EpisodeId, PrepareReport, RecordsPart, RetireReply
from ckpt_events.participants.server.store_read import Share
from ckpt_events.participants.server.work import EpisodeView
from ckpt_events.participants.server.workers.frames import (
    Advance,
    Advanced,
    Close,
    Closed,
    Discard,
    Forget,
    Get,
    Hello,
    InstallStaged,
    Mark,
    Message,
    Open,
    PartShare,
    Reply,
    Report,
    Request,
    Retire,
    Shutdown,
    Stage,
    Staged,
    Start,
    Started,
    Stop,
    Unreadable,
    WorkerRequest,
    WorkerState,
    WritePart,
    WrittenPart,
    decode_frame,
    decode_reply,
    encode_body,
    encode_frame,
    read_frame,
    reply_type,
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


EPISODE = EpisodeId("r1", 2)
TRACEPARENT = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
#: One request of each kind, every field set, with a reply of its reply type.
KINDS: dict[type[Request[Any]], tuple[Request[Any], Any]] = {
    Hello: (Hello(3, "s3cret", 41, "http://127.0.0.1:9000"), WorkerState(False, {"r1": 2})),
    Start: (Start(EPISODE, 5), Started("r1-a2", 0)),
    Advance: (Advance(EPISODE), Advanced(1, False)),
    Get: (
        Get("r1-a2"),
        EpisodeView("r1-a2", "r1", 2, 1, 5, False, "running", "environment", {"n": 1}, 3),
    ),
    Close: (Close(), None),
    Open: (Open(), None),
    Closed: (Closed("c1", 12.5), PrepareReport(ready=False, blockers=["r1-a2"], blocker_count=1)),
    Report: (Report(0.25), PrepareReport(ready=True)),
    WritePart: (
        WritePart(["/root", "gym", "environment", "env-0"], [EPISODE], "c1", 99.5),
        WrittenPart("records-" + "0" * 64 + ".jsonl", "0" * 64, 1, 120, ["r1-a2"], {"k": [1]}),
    ),
    Stop: (Stop(["r1-a2"]), None),
    Shutdown: (Shutdown(), ["POST /work/advance", ""]),
    Stage: (
        Stage(
            ["/root"],
            [
                PartShare(
                    RecordsPart(worker=1, records_file="f", records_sha256="s", record_count=4), Share(2, 1)
                )
            ],
            "c1",
        ),
        Staged(["r1-a2"], 120),
    ),
    InstallStaged: (InstallStaged(["r9-a0"], "c1"), ["r1-a3"]),
    Discard: (Discard(), None),
    Retire: (Retire([EPISODE], "c1"), RetireReply(retired=["r1-a2"], retired_count=1)),
    Mark: (Mark(EPISODE), None),
    Forget: (Forget(["r1"]), None),
}


def test_every_request_kind_and_its_reply_round_trip():
    """Each kind of the union (and no other) is listed above; each request decodes to itself, each
    reply to itself as its request's reply type; the kinds are the protocol's snake-case words."""
    assert set(KINDS) == set(typing.get_args(WorkerRequest))
    for kind, (request, reply) in KINDS.items():
        message = Message(7, request, TRACEPARENT)
        assert decode_frame(encode_frame(message)[4:]) == message
        assert message.kind == kind.__struct_config__.tag and message.kind.islower()
        assert decode_reply(kind, encode_body(reply)) == reply
        assert reply_type(kind) is not None or reply is None


async def test_a_message_and_a_reply_round_trip():
    """Encoded frames decode to the same message and reply."""
    message = Message(1, WritePart(["/r"], None, None, None), TRACEPARENT)
    assert await _read(encode_frame(message)) == message
    reply = Reply(1, True, encode_body([1, 2]))
    assert decode_frame(encode_frame(reply)[4:]) == reply


def test_a_request_of_an_unknown_kind_or_shape_arrives_unreadable_and_a_bad_reply_does_not_decode():
    """An unknown kind, or a known one whose fields do not check, is an ``Unreadable`` message (the
    channel refuses it and goes on); a reply of another type raises ``ValidationError``."""
    for body in ({"kind": "rm -rf"}, {"kind": "start", "steps": "many"}):
        payload = msgspec.msgpack.encode({"t": "m", "id": 4, "body": body})
        message = decode_frame(payload)
        assert isinstance(message, Message) and isinstance(message.body, Unreadable)
        assert (message.id, message.kind) == (4, body["kind"]) and message.body.why
    with pytest.raises(msgspec.ValidationError):
        decode_reply(Start, encode_body({"capture_key": "FORGED", "boundary": -1}))


async def test_bad_frames_are_refused():
    """Over the bound, truncated, undecodable and unknown-shaped frames raise WorkerChannelError."""
    with pytest.raises(WorkerChannelError, match="over the bound"):
        encode_frame(Message(1, Stop(["y" * 2000])), max_frame=1024)
    with pytest.raises(WorkerChannelError, match="over the bound"):
        await _read(struct.pack(">I", 5000) + b"x")
    with pytest.raises(WorkerChannelError, match="truncated"):
        await _read(struct.pack(">I", 100) + b"x" * 10)
    with pytest.raises(WorkerChannelError, match="truncated"):
        await _read(b"\x00\x00")
    with pytest.raises(WorkerChannelError, match="undecodable"):
        await _read(struct.pack(">I", 3) + b"\xc1\xc1\xc1")
    with pytest.raises(WorkerChannelError, match="undecodable"):
        decode_frame(encode_frame(Reply(1, True))[4:].replace(b"reply_to", b"reply_tx"))
    assert await _read(b"") is None
