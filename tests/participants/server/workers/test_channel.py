"""``participants.server.workers.channel``: ``FrameChannel`` over a real Unix socket pair."""

from __future__ import annotations

import logging
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import pytest

from ckpt_events.participants.errors import ProtocolRefusal, WorkerChannelError
from ckpt_events.participants.protocol import EpisodeId
from ckpt_events.participants.server.workers.channel import FrameChannel, UnknownKind, current_arrival
from ckpt_events.participants.server.workers.frames import (
    Advance,
    Advanced,
    Close,
    Forget,
    Get,
    Message,
    Reply,
    Start,
    Started,
    encode_frame,
    read_frame,
)
from ckpt_events.vocab import ErrorCode

pytestmark = pytest.mark.anyio

EPISODE = EpisodeId("r1", 0)


async def _none(message: Message) -> Any:
    return None


@asynccontextmanager
async def _pair(
    far_handler: Callable[[Message], Any], near_handler: Any = _none
) -> AsyncIterator[tuple[FrameChannel, FrameChannel]]:
    """Two running channels on the two ends of a Unix socket pair; both closed at the end."""
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    near = FrameChannel(await anyio.abc.UNIXSocketStream.from_socket(left), near_handler, name="near")
    far = FrameChannel(await anyio.abc.UNIXSocketStream.from_socket(right), far_handler, name="far")
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(near.run)
            tg.start_soon(far.run)
            yield near, far
            tg.cancel_scope.cancel()


@asynccontextmanager
async def _raw_peer() -> AsyncIterator[tuple[FrameChannel, anyio.abc.SocketStream]]:
    """A running channel and the other end as a bare stream, for writing frames by hand."""
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    near = FrameChannel(await anyio.abc.UNIXSocketStream.from_socket(left), _none, name="near")
    raw = await anyio.abc.UNIXSocketStream.from_socket(right)
    with anyio.fail_after(5):
        async with raw, anyio.create_task_group() as tg:
            tg.start_soon(near.run)
            yield near, raw
            tg.cancel_scope.cancel()


async def test_a_request_gets_its_reply_decoded_as_its_type_both_ways() -> None:
    """Each side requests of the other; replies come back as the request's reply type."""
    arrivals: list[int | None] = []

    async def far_handler(message: Message) -> Any:
        arrivals.append(current_arrival())
        match message.body:
            case Start(episode_id=episode_id, steps=steps):
                return Started(episode_id.capture_key, steps)
            case Advance():
                return Advanced(2, True)
        return None

    before = time.time_ns()
    async with _pair(far_handler, _none) as (near, far):
        assert await near.request(Start(EPISODE, 3)) == Started("r1", 3)
        assert await near.request(Advance(EPISODE)) == Advanced(2, True)
        assert await far.request(Get("k")) is None
    assert all(a is not None and before <= a <= time.time_ns() for a in arrivals) and len(arrivals) == 2
    assert current_arrival() is None


async def test_inline_messages_are_handled_one_at_a_time_in_arrival_order() -> None:
    """Posts of inline kinds are handled in the order they were queued."""
    seen: list[str] = []
    done = anyio.Event()

    async def far_handler(message: Message) -> Any:
        assert isinstance(message.body, Forget)
        await anyio.sleep(0.001 * (5 - len(seen)))  # the earlier ones are slower: order still holds
        seen.extend(message.body.rollout_ids)
        if len(seen) == 5:
            done.set()

    async with _pair(far_handler) as (near, _far):
        for i in range(5):
            near.post(Forget([f"r{i}"]))
        await done.wait()
    assert seen == ["r0", "r1", "r2", "r3", "r4"]


async def test_refusals_unknown_kinds_and_failures_come_back_as_precise_errors() -> None:
    """A ``ProtocolRefusal`` keeps its code; ``UnknownKind`` is a 400 ``unknown_kind`` (counted as a
    protocol error on the answering side); any other exception is a ``checkpoint_error``."""

    async def far_handler(message: Message) -> Any:
        match message.body:
            case Start():
                raise ProtocolRefusal(ErrorCode.ADMISSION_CLOSED, "admission is closed")
            case Get():
                raise UnknownKind(message.kind)
            case _:
                raise ValueError("disk on fire")

    async with _pair(far_handler) as (near, far):
        with pytest.raises(ProtocolRefusal) as refused:
            await near.request(Start(EPISODE, 3))
        assert (refused.value.code, refused.value.detail) == (
            ErrorCode.ADMISSION_CLOSED,
            "admission is closed",
        )
        with pytest.raises(WorkerChannelError) as unknown:
            await near.request(Get("k"))
        assert str(unknown.value) == "near: get refused: unknown_kind: unknown message kind 'get'"
        assert far.protocol_errors == 1
        with pytest.raises(ProtocolRefusal) as failed:
            await near.request(Advance(EPISODE))
        assert (failed.value.code, failed.value.detail) == (ErrorCode.CHECKPOINT_ERROR, "disk on fire")
        assert not near.closed and not far.closed


async def test_a_reply_of_the_wrong_type_is_the_peer_s_fault() -> None:
    """A reply that does not decode as the request's reply type raises ``WorkerChannelError``."""

    async def far_handler(message: Message) -> Any:
        return {"not": "started"}

    async with _pair(far_handler) as (near, _far):
        with pytest.raises(WorkerChannelError, match=r"^near: start: a bad reply: "):
            await near.request(Start(EPISODE, 3))


async def test_no_reply_in_time_says_the_wait_to_the_hundredth() -> None:
    """A commit's or restore's wait is its deadline's remaining time: it read "no reply within
    4.99668 s" in the 503 a controller gets; said to the hundredth."""
    release = anyio.Event()

    async def far_handler(message: Message) -> Any:
        await release.wait()
        return Advanced(1, False)

    async with _pair(far_handler) as (near, _far):
        with pytest.raises(WorkerChannelError) as info:
            await near.request(Advance(EPISODE), timeout=0.0499668)
        release.set()
    assert str(info.value) == "near: advance: no reply within 0.05 s"


async def test_no_reply_in_time_raises_and_the_late_reply_is_logged_once_as_late(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The request gives up after ``timeout``; its reply, when it comes, is a warning, not a
    protocol error."""
    caplog.set_level(logging.WARNING, "ckpt_events.workers")
    release = anyio.Event()

    async def far_handler(message: Message) -> Any:
        await release.wait()
        return Advanced(1, False)

    async with _pair(far_handler) as (near, _far):
        with pytest.raises(WorkerChannelError) as info:
            await near.request(Advance(EPISODE), timeout=0.05)
        assert str(info.value) == "near: advance: no reply within 0.05 s"
        release.set()
        with anyio.fail_after(2):
            while not caplog.records:
                await anyio.sleep(0.01)
        assert near.protocol_errors == 0
    assert [r.getMessage() for r in caplog.records] == [
        "near: late reply to advance 1, given up on before it came: dropped"
    ]


async def test_closing_fails_pending_requests_at_once_and_refuses_new_ones() -> None:
    """``close`` wakes a waiting request (``ended``), calls ``on_close`` once, and is idempotent."""
    closes: list[int] = []

    async def far_handler(message: Message) -> Any:
        await anyio.sleep_forever()

    async with _pair(far_handler) as (near, _far):
        near.on_close = lambda: closes.append(1)

        async def close_soon() -> None:
            await anyio.sleep(0.02)
            near.close()

        async with anyio.create_task_group() as tg:
            tg.start_soon(close_soon)
            with pytest.raises(WorkerChannelError) as info:
                await near.request(Advance(EPISODE))
        assert str(info.value) == "near: advance: ended"
        near.close()
        with pytest.raises(WorkerChannelError) as refused:
            near.post(Close())
        assert str(refused.value) == "near: channel is closed (ended)"
    assert closes == [1]


async def test_finish_sends_what_is_queued_then_closes() -> None:
    """Posts queued before ``finish`` reach the peer, then the stream ends; nothing more is queued."""
    async with _raw_peer() as (near, raw):
        near.post(Forget(["a"]))
        near.post(Forget(["b"]))
        near.finish()
        with pytest.raises(WorkerChannelError, match="channel is closed"):
            near.post(Forget(["c"]))
        frames = [await read_frame(raw), await read_frame(raw), await read_frame(raw)]
        await near.wait_closed()
    assert frames == [Message(1, Forget(["a"])), Message(2, Forget(["b"])), None]
    assert near.failure is None


async def test_a_peer_that_stops_reading_ends_the_channel_as_a_lost_connection() -> None:
    """A write that breaks (the peer shut its reading side) ends ``run()`` quietly, with
    ``failure`` set as a broken read sets it, though it failed in ``_write``'s task."""
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    near = FrameChannel(await anyio.abc.UNIXSocketStream.from_socket(left), _none, name="near")
    with right, anyio.fail_after(5):
        right.shutdown(socket.SHUT_RD)
        near.post(Forget(["a"]))
        await near.run()
    assert near.closed and near.failure == "connection lost: BrokenResourceError()"


async def test_a_reply_to_an_unknown_id_is_counted_and_the_channel_goes_on() -> None:
    """A stray reply is a protocol error; the next message is still answered."""
    async with _raw_peer() as (near, raw):
        await raw.send(encode_frame(Reply(42, True)))
        await raw.send(encode_frame(Message(1, Close())))
        reply = await read_frame(raw)
        assert reply == Reply(1, True) and near.protocol_errors == 1 and not near.closed


@pytest.mark.parametrize(
    ("data", "failure"),
    [
        (struct.pack(">I", 5) + b"\xc1junk", "undecodable frame: "),
        (struct.pack(">I", 1 << 30), f"frame of {1 << 30} bytes is over the bound of "),
    ],
)
async def test_a_bad_frame_ends_the_channel_with_its_reason(data: bytes, failure: str) -> None:
    """An undecodable or oversized frame drops the peer: ``failure`` says why, ``closed`` is set."""
    async with _raw_peer() as (near, raw):
        await raw.send(data)
        await near.wait_closed()
        assert near.failure is not None and near.failure.startswith(failure)
        with pytest.raises(WorkerChannelError, match=r"^near: channel is closed \(" + failure[:10]):
            near.post(Close())


async def test_a_frame_over_the_sender_s_bound_is_refused_before_it_is_sent() -> None:
    """``post`` of a body larger than ``max_frame`` raises and queues nothing."""
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with right:
        near = FrameChannel(await anyio.abc.UNIXSocketStream.from_socket(left), _none, name="n", max_frame=64)
        with pytest.raises(WorkerChannelError, match=r"^frame of \d+ bytes is over the bound of 64$"):
            near.post(Forget(["x" * 100]))
        await near.aclose()
        assert near.closed


async def test_a_failed_handler_is_logged_bounded_and_redacted(caplog: pytest.LogCaptureFixture) -> None:
    """A handler's error quoting a URL's credentials and a megabyte payload is logged with its
    traceback, its message cut and the credentials redacted (as the library's own records are)."""
    caplog.set_level(logging.ERROR, "ckpt_events.workers")

    secret = "hunter" + "2"  # not in this line as the traceback quotes it

    async def far_handler(message: Message) -> Any:
        raise ValueError(f"POST https://user:{secret}@collector.example/v1 failed: " + "x" * 1_000_000)

    async with _pair(far_handler) as (near, far):
        with pytest.raises(ProtocolRefusal):
            await near.request(Advance(EPISODE))
    [record] = [r for r in caplog.records if r.name == "ckpt_events.workers"]
    logged = caplog.text
    assert record.getMessage() == "far: advance failed"
    assert record.exc_info is not None
    assert secret not in logged
    assert "Traceback" in logged and "far_handler" in logged  # the traceback stays
    assert len(logged) < 10_000


async def test_a_failed_handlers_reply_carries_its_text_redacted_before_the_cut() -> None:
    """A handler's exception went back as ``str(exc)[:500]``: a ``user:password@`` and a
    ``Bearer`` token verbatim, and a URL cut before its ``@`` where no rule could see it."""
    secret = "upload to https://alice:hunter2@store.example failed; Authorization: Bearer eyJsecret123"
    across = "x" * 480 + " https://bob:pw2@store.example/"  # the 500th character falls inside it

    async def far_handler(message: Message) -> Any:
        raise RuntimeError(secret if isinstance(message.body, Advance) else across)

    async with _pair(far_handler) as (near, _far):
        with pytest.raises(ProtocolRefusal) as failed:
            await near.request(Advance(EPISODE))
        assert failed.value.detail == (
            "upload to https://[REDACTED]@store.example failed; Authorization: Bearer [REDACTED]"
        )
        with pytest.raises(ProtocolRefusal) as cut:
            await near.request(Start(EPISODE, 3))
    assert "bob" not in cut.value.detail and "pw2" not in cut.value.detail
    assert cut.value.detail.startswith("x" * 480 + " https://[REDACTED]") and len(cut.value.detail) <= 503


class _RaisingHandler(logging.Handler):
    """A user's handler whose ``emit`` raises (not through ``handleError``)."""

    def emit(self, record: logging.LogRecord) -> None:
        raise RuntimeError("handler down")


async def test_a_raising_log_handler_never_ends_the_channel(caplog: pytest.LogCaptureFixture) -> None:
    """A root handler raising in ``emit``: logging a failed handler raised out of the answering
    task, the reply was never sent and the channel ended; the failure is answered now."""

    async def far_handler(message: Message) -> Any:
        raise ValueError("disk on fire")

    handler = _RaisingHandler()
    logging.getLogger().addHandler(handler)
    try:
        async with _pair(far_handler) as (near, far):
            for _ in range(2):
                with pytest.raises(ProtocolRefusal) as failed:
                    await near.request(Advance(EPISODE))
                assert failed.value.detail == "disk on fire"
            assert not far.closed and not near.closed
    finally:
        logging.getLogger().removeHandler(handler)
