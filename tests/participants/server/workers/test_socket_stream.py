"""A worker socket's channel cancelled as its socket turns readable leaves no error in the loop.

The race of ``socket_stream``: anyio's Unix stream queued its reader callback, the read was
cancelled in the same loop iteration, and the callback set a result on the cancelled future
(``InvalidStateError`` from a loop callback, which fails the test through anyio's runner).
"""

from __future__ import annotations

import socket
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
import pytest
from anyio.streams.stapled import StapledObjectStream

from ckpt_events.participants.server.workers.channel import FrameChannel
from ckpt_events.participants.server.workers.frames import Close, Message, encode_frame
from ckpt_events.participants.server.workers.socket_stream import loop_socket_stream

pytestmark = pytest.mark.anyio


async def _echo(message: Message) -> Any:
    return message.body


async def test_a_read_cancelled_in_the_iteration_its_socket_turns_readable_is_quiet() -> None:
    """The peer's frame makes the socket readable; the next loop iteration cancels the read first."""
    near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    channel = FrameChannel(await anyio.abc.UNIXSocketStream.from_socket(near), _echo, name="near")
    with far, anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(channel.run)
            await anyio.wait_all_tasks_blocked()  # the channel waits for its socket to be readable
            far.send(encode_frame(Message(1, Close())))
            # Woken in the next iteration ahead of the selector's reader callback, which is
            # queued in that same iteration: the cancel lands between the two.
            await anyio.lowlevel.checkpoint()
            tg.cancel_scope.cancel()
    assert channel.closed


async def test_the_loop_stream_reads_writes_and_ends_as_anyio_streams_do() -> None:
    """Bytes both ways, ``EndOfStream`` at the peer's end, ``ClosedResourceError`` after aclose."""
    near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    stream = loop_socket_stream(await anyio.abc.UNIXSocketStream.from_socket(near))
    assert type(stream).__name__ == "_LoopSocketStream"
    with far, anyio.fail_after(5):
        await stream.send(b"ping")
        assert far.recv(16) == b"ping"
        far.send(b"pong")
        assert await stream.receive() == b"pong"
        assert stream.extra(anyio.abc.SocketAttribute.family) == socket.AF_UNIX
        far.shutdown(socket.SHUT_WR)
        with pytest.raises(anyio.EndOfStream):
            await stream.receive()
        await stream.aclose()
        with pytest.raises(anyio.ClosedResourceError):
            await stream.receive()
        with pytest.raises(anyio.ClosedResourceError):
            await stream.send(b"late")


async def test_other_streams_are_left_as_they_are() -> None:
    """A memory stream (or a TCP stream: transports have no such race) is not wrapped."""
    send, receive = anyio.create_memory_object_stream[bytes](1)
    stapled = StapledObjectStream(send, receive)
    with send, receive:
        assert loop_socket_stream(stapled) is stapled  # type: ignore[arg-type]
