"""``loop_socket_stream``: a worker socket read and written by the event loop's own socket calls.

Why not anyio's Unix stream as it comes: on asyncio, anyio (4.16, and its main branch in
December 2026) waits for a readable Unix socket by registering the waiting future's bare
``set_result`` as the selector's reader callback. When the reading task is cancelled in the
very loop iteration in which the selector reported the socket readable (a worker's channel
cancelled as its peer's last frame or end of stream arrives: every teardown), the reader
callback is already queued and calls ``set_result`` on the cancelled future, and the loop
reports ``InvalidStateError`` from a callback (1 in 5 runs of the multi-worker teardown
test; every time in ``test_socket_stream``, which schedules that iteration on purpose).
asyncio's own ``sock_recv`` and ``sock_sendall`` check that their future is still pending
first, so a cancelled read ends quietly. TCP streams use transports and are not affected.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import anyio.lowlevel
from anyio.abc import ByteStream, SocketAttribute, UNIXSocketStream

__all__ = ["loop_socket_stream"]


def loop_socket_stream(stream: ByteStream) -> ByteStream:
    """``stream`` read and written through the running asyncio loop's ``sock_recv`` and
    ``sock_sendall`` if it is an anyio Unix socket stream on asyncio; else ``stream`` itself."""
    if not isinstance(stream, UNIXSocketStream):
        return stream
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio (trio): its sockets have no such race
        return stream
    return _LoopSocketStream(stream, loop)


class _LoopSocketStream(ByteStream):
    """anyio's ``UNIXSocketStream`` with its reads and writes done by the loop's socket calls;
    closing still goes through anyio's stream (which owns the socket)."""

    def __init__(self, stream: UNIXSocketStream, loop: asyncio.AbstractEventLoop) -> None:
        self._stream = stream
        self._socket: socket.socket = stream.extra(SocketAttribute.raw_socket)
        self._loop = loop
        self._closed = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        # A checkpoint first, as anyio's own streams do: sock_recv returns without yielding
        # when bytes are waiting, and a reader fed without pause would never let others run.
        await anyio.lowlevel.checkpoint()
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            data = await self._loop.sock_recv(self._socket, max_bytes)
        except OSError as exc:
            if self._closed:
                raise anyio.ClosedResourceError from None
            raise anyio.BrokenResourceError from exc
        if not data:
            raise anyio.EndOfStream
        return data

    async def send(self, item: bytes) -> None:
        await anyio.lowlevel.checkpoint()
        if self._closed:
            raise anyio.ClosedResourceError
        try:
            await self._loop.sock_sendall(self._socket, item)
        except OSError as exc:
            if self._closed:
                raise anyio.ClosedResourceError from None
            raise anyio.BrokenResourceError from exc

    async def send_eof(self) -> None:
        await self._stream.send_eof()

    async def aclose(self) -> None:
        self._closed = True
        await self._stream.aclose()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return self._stream.extra_attributes
