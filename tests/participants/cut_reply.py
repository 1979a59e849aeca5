"""A peer that takes one connection, reads the request and answers a head promising 100 bytes,
then closes after 5: reached, and no whole reply (for the wording of such a failure)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator

import anyio


@contextlib.asynccontextmanager
async def cut_reply_and_closed_port() -> AsyncIterator[tuple[str, str]]:
    """(the URL of a peer that cuts its reply short, the URL of a port nobody listens on); the
    peer answers one connection, in a thread, while the block runs."""
    with socket.socket() as cutter, socket.socket() as closed:
        cutter.bind(("127.0.0.1", 0))
        cutter.listen()
        cutter.settimeout(10)  # bounded: a test that never connects does not hang its thread
        closed.bind(("127.0.0.1", 0))

        def answer_and_cut() -> None:
            with contextlib.suppress(TimeoutError):
                conn, _ = cutter.accept()
                with conn:
                    conn.settimeout(5)
                    conn.recv(65536)
                    conn.sendall(b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"pha')

        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, answer_and_cut)
            yield f"http://127.0.0.1:{cutter.getsockname()[1]}", f"http://127.0.0.1:{closed.getsockname()[1]}"
