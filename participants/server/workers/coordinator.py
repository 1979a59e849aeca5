"""``WorkerCoordinator``: the main process's end of the worker socket.

It listens on a Unix socket in a private directory (mode 0700, created here, removed at the
end), takes one connection per worker, and knows which workers are connected. A worker joins
by sending ``hello`` with its index; the reply is the server's state (``state_provider``), so
a worker that joins late (or restarts) gets admission and every retired mark. A worker whose
connection ends, or that sends a bad frame, is lost (``on_lost``).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import anyio
from anyio.abc import SocketStream, TaskStatus

from ckpt_events import ErrorCode, InvalidTypeError, InvalidValueError
from participants.errors import ProtocolRefusal
from participants.server.workers.channel import DEFAULT_REPLY_SECONDS, FrameChannel, UnknownKind
from participants.server.workers.frames import DEFAULT_MAX_FRAME, Message

__all__ = ["ENV_SOCKET", "WorkerCoordinator"]

log = logging.getLogger("ckpt_events.workers")

#: The environment variable a worker process reads the coordinator's socket path from.
ENV_SOCKET: Final = "CKPT_EVENTS_COORDINATOR_SOCKET"
_HELLO_SECONDS: Final = 10.0
#: A worker's own port, as it announces it: ``http://<host>:<port>`` and nothing more.
_URL: Final = re.compile(r"http://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]{1,253}):[0-9]{1,5}")


class WorkerCoordinator:
    """Accepts the connections of ``workers`` workers on a private Unix socket."""

    def __init__(
        self,
        workers: int,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        reply_seconds: float = DEFAULT_REPLY_SECONDS,
        socket_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int):
            raise InvalidTypeError(f"workers must be an int >= 1, not {workers!r}")
        if workers < 1:
            raise InvalidValueError(f"workers must be an int >= 1, not {workers!r}")
        self.workers = workers
        self.max_frame = max_frame
        self.reply_seconds = reply_seconds
        self._own_dir = socket_dir is None
        self.directory = Path(tempfile.mkdtemp(prefix="ckpt-workers-") if socket_dir is None else socket_dir)
        os.chmod(self.directory, 0o700)
        self.socket_path = str(self.directory / "coordinator.sock")
        self.channels: dict[int, FrameChannel] = {}
        #: Each connected worker's own work port (``http://host:port``), if it serves one.
        self.urls: dict[int, str] = {}
        self.state_provider: Callable[[], Any] = dict
        self.on_lost: Callable[[int], None] = lambda index: None
        self.on_joined: Callable[[int], None] = lambda index: None
        self._joined = anyio.Event()
        #: Set when the server stops: its workers' connections ending then are not losses.
        self.stopping = False

    # -- who is connected -------------------------------------------------------------------

    def connected(self) -> list[int]:
        """Indexes of the workers connected now, in order."""
        return sorted(i for i, c in self.channels.items() if not c.closed)

    def channel(self, index: int) -> FrameChannel:
        """Worker ``index``'s channel; 503 ``checkpoint_coordinator_unavailable`` if not connected."""
        channel = self.channels.get(index)
        if channel is None or channel.closed:
            raise ProtocolRefusal(
                ErrorCode.CHECKPOINT_COORDINATOR_UNAVAILABLE, f"worker {index} is not connected"
            )
        return channel

    async def wait_connected(self, count: int, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until ``count`` workers are connected."""
        with anyio.move_on_after(timeout):
            while len(self.connected()) < count:
                joined = self._joined
                await joined.wait()
        return len(self.connected()) >= count

    # -- the socket -------------------------------------------------------------------------

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; ``task_status.started()`` once the socket exists."""
        listener = await anyio.create_unix_listener(self.socket_path)
        os.chmod(self.socket_path, 0o600)
        try:
            async with listener, anyio.create_task_group() as tg:
                task_status.started()
                while True:
                    stream = await listener.accept()
                    tg.start_soon(self._connection, stream)
        finally:
            self.stopping = True
            for channel in list(self.channels.values()):
                channel.close()
            if self._own_dir:
                shutil.rmtree(self.directory, ignore_errors=True)

    async def _connection(self, stream: SocketStream) -> None:
        joined: list[int] = []
        settled = anyio.Event()  # the hello came, or the channel closed before it

        async def settle_on_close() -> None:
            await channel.wait_closed()
            settled.set()

        async def handle(message: Message) -> Any:
            body = message.body if isinstance(message.body, dict) else {}
            if message.kind != "hello" or joined:
                raise UnknownKind(message.kind)
            index = body.get("index")
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.workers:
                raise ProtocolRefusal(ErrorCode.CHECKPOINT_ERROR, f"no worker slot {index!r}")
            current = self.channels.get(index)
            if current is not None and not current.closed:
                raise ProtocolRefusal(ErrorCode.CHECKPOINT_CONFLICT, f"worker {index} is connected already")
            url = body.get("url")
            if url is not None and (not isinstance(url, str) or not _URL.fullmatch(url)):
                raise ProtocolRefusal(
                    ErrorCode.CHECKPOINT_ERROR, f"hello: {str(url)[:80]!r} is not an http URL"
                )
            joined.append(index)
            self.channels[index] = channel
            if url is None:
                self.urls.pop(index, None)
            else:
                self.urls[index] = url
            channel.on_close = lambda: self._closed(index, channel)
            log.info("worker %d joined (pid %s)", index, body.get("pid"))
            self.on_joined(index)
            self._joined.set()
            self._joined = anyio.Event()
            settled.set()
            return self.state_provider()

        channel = FrameChannel(
            stream, handle, name="coordinator", inline=("hello",), max_frame=self.max_frame
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(channel.run)
            tg.start_soon(settle_on_close)
            with anyio.move_on_after(_HELLO_SECONDS):
                await settled.wait()
            if not joined:
                # A peer that hung up first (or whose first frame was bad, logged by the channel)
                # did not keep us waiting: only the one silent past the deadline is this error.
                if not channel.closed:
                    log.error(
                        "protocol error: a connection sent no hello within %g s; dropped", _HELLO_SECONDS
                    )
                tg.cancel_scope.cancel()
            else:
                channel.name = f"coordinator<-worker {joined[0]}"

    def _closed(self, index: int, channel: FrameChannel) -> None:
        if self.channels.get(index) is channel:
            self.urls.pop(index, None)
        if self.channels.get(index) is channel and not self.stopping:
            log.warning("worker %d lost: %s", index, channel.failure or "connection ended")
            self.on_lost(index)
