"""``WorkerCoordinator``: the main process's end of the worker socket.

It listens on a Unix socket in a private directory (mode 0700, created here, removed at the
end), takes one connection per worker, and knows which workers are connected. A worker joins
by sending ``hello`` with its index and the secret the server gave that start of it
(``new_secret``: in the worker's environment, a fresh one each time the worker is started,
so a process that read an old one cannot take the slot); the reply is the server's state
(``state_provider``), so a worker that joins late (or restarts) gets admission and every
retired mark. A worker whose connection ends, or that sends a bad frame, is lost (``on_lost``).

Until its ``hello`` a connection is a stranger: at most one per worker slot plus
``MAX_STRANGERS`` at once (more are closed at once), frames of at most ``HELLO_MAX_FRAME``
bytes, and any first message but a valid ``hello`` ends it. Refusals are logged a bounded
number of times, then counted.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Final

import anyio
import msgspec
from anyio.abc import SocketStream, TaskStatus

from ckpt_events.checks import library_logger
from ckpt_events.participants.errors import ProtocolRefusal, WorkerChannelError, check_int, shown
from ckpt_events.participants.server.workers.channel import DEFAULT_REPLY_SECONDS, FrameChannel, UnknownKind
from ckpt_events.participants.server.workers.frames import (
    DEFAULT_MAX_FRAME,
    Hello,
    Message,
    Shutdown,
    Unreadable,
    WorkerState,
)
from ckpt_events.vocab import ErrorCode

__all__ = [
    "ENV_SECRET",
    "ENV_SOCKET",
    "HELLO_MAX_FRAME",
    "MAX_STRANGERS",
    "SHUTDOWN_REPLY_SECONDS",
    "PortCuts",
    "WorkerCoordinator",
]

log = library_logger("ckpt_events.workers")

#: The environment variable a worker process reads the coordinator's socket path from.
ENV_SOCKET: Final = "CKPT_EVENTS_COORDINATOR_SOCKET"
#: The environment variable a worker process reads its ``hello`` secret from.
ENV_SECRET: Final = "CKPT_EVENTS_WORKER_SECRET"
_HELLO_SECONDS: Final = 10.0
#: Connections that have not said ``hello`` yet, at once, beyond one per worker slot (room for
#: restarts and strays). A bound of 8 in all closed the 9th worker of a start unheard: it died
#: with a traceback and spent a restart (4 of 64 workers at start-up on 2 cores).
MAX_STRANGERS: Final = 8
#: The largest frame a connection may send before its ``hello`` (a hello is a few hundred bytes).
HELLO_MAX_FRAME: Final = 64 * 1024
#: Refused connections logged one by one; after that one line per ``_REFUSED_EVERY`` refusals.
_REFUSED_LOGGED: Final = 10
_REFUSED_EVERY: Final = 1000
#: A worker's own port, as it announces it: ``http://<host>:<port>`` and nothing more.
_URL: Final = re.compile(r"http://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]{1,253}):[0-9]{1,5}")
#: How long a stopping server waits for its workers to say what their own ports cut (a local
#: socket answers in milliseconds; a worker stalled or stopped is then said not to have reported).
SHUTDOWN_REPLY_SECONDS: Final = 1.0


class PortCuts(msgspec.Struct, frozen=True):
    """What the workers' own ports cut as the server stopped: each request (``"METHOD /path on
    worker 0"``, ``""`` for one not known), and the workers that did not say
    (``unreported``: what their ports cut is not known)."""

    requests: list[str]
    unreported: list[int]


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
        self.workers = check_int(workers, f"workers must be an int >= 1, not {shown(workers)}", minimum=1)
        self.max_frame = max_frame
        self.reply_seconds = reply_seconds
        self._own_dir = socket_dir is None
        self.directory = Path(tempfile.mkdtemp(prefix="ckpt-workers-") if socket_dir is None else socket_dir)
        os.chmod(self.directory, 0o700)
        self.socket_path = str(self.directory / "coordinator.sock")
        self.channels: dict[int, FrameChannel] = {}
        #: Each connected worker's own work port (``http://host:port``), if it serves one.
        self.urls: dict[int, str] = {}
        self.state_provider: Callable[[], WorkerState] = WorkerState
        self.on_lost: Callable[[int], None] = lambda index: None
        self.on_joined: Callable[[int], None] = lambda index: None
        self._joined = anyio.Event()
        #: Set when the server stops: its workers' connections ending then are not losses.
        self.stopping = False
        self._secrets: dict[int, str] = {}
        self._strangers = 0
        #: Every worker may be a stranger at once (all start together), and a few more.
        self.max_strangers = self.workers + MAX_STRANGERS
        #: Connections refused before or at their ``hello`` (too many, bad frame, bad hello).
        self.refused = 0
        #: What the workers' own ports cut as the server stopped (``shut_down_ports``), once asked.
        self.port_cuts: PortCuts | None = None

    def new_secret(self, index: int) -> str:
        """The secret worker ``index``'s next start must say in its ``hello`` (the last one
        given is the only one taken)."""
        secret = secrets.token_hex(16)
        self._secrets[index] = secret
        return secret

    def _refuse(self, why: str) -> None:
        self.refused += 1
        if self.refused <= _REFUSED_LOGGED or self.refused % _REFUSED_EVERY == 0:
            log.error("worker socket: refused a connection (%s); %d refused so far", why, self.refused)

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

    async def shut_down_ports(self, timeout: float = SHUTDOWN_REPLY_SECONDS) -> PortCuts:
        """Have every connected worker cut what its own port still serves (the server is
        stopping), and keep what they say as ``port_cuts``; within ``timeout`` seconds, even
        cancelled (a forced exit): a worker not answering by then is ``unreported``."""
        said: dict[int, list[str]] = {}
        asked = self.connected()

        async def ask(index: int) -> None:
            try:
                cut = await self.channels[index].request(Shutdown(), timeout=timeout)
            except (ProtocolRefusal, WorkerChannelError):
                return  # unreported: an older worker, or one gone or stalled
            said[index] = [f"{request} on worker {index}" if request else "" for request in cut]

        with anyio.CancelScope(shield=True), anyio.move_on_after(timeout + 0.5):
            async with anyio.create_task_group() as tg:
                for index in asked:
                    tg.start_soon(ask, index)
        self.port_cuts = PortCuts(
            requests=[r for index in sorted(said) for r in said[index]],
            unreported=[index for index in asked if index not in said],
        )
        return self.port_cuts

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
        if self._strangers >= self.max_strangers:
            self._refuse(f"{self.max_strangers} connections are waiting for their hello already")
            with anyio.CancelScope(shield=True):
                await stream.aclose()
            return
        self._strangers += 1
        joined: list[int] = []
        refused: list[ProtocolRefusal] = []
        settled = anyio.Event()  # the hello came (or was refused), or the channel closed before it

        async def settle_on_close() -> None:
            await channel.wait_closed()
            settled.set()

        async def handle(message: Message) -> WorkerState:
            if joined:
                raise UnknownKind(message.kind)
            try:
                state = self._hello(message, channel, joined)
                settled.set()
                return state
            except ProtocolRefusal as exc:
                self._refuse(exc.detail)
                refused.append(exc)
                settled.set()  # woken once the refusal is queued: then finish() (one try)
                raise

        channel = FrameChannel(stream, handle, name="coordinator", max_frame=HELLO_MAX_FRAME)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(channel.run)
                tg.start_soon(settle_on_close)
                with anyio.move_on_after(_HELLO_SECONDS):
                    await settled.wait()
                if refused:
                    channel.finish()  # the refusal goes out, then the connection ends
                    with anyio.move_on_after(_HELLO_SECONDS):
                        await channel.wait_closed()
                    tg.cancel_scope.cancel()
                elif not joined:
                    # A peer that hung up first (or whose first frame was bad, logged by the channel)
                    # did not keep us waiting: only the one silent past the deadline is this error.
                    if not channel.closed:
                        self._refuse(f"no hello within {_HELLO_SECONDS:g} s")
                    tg.cancel_scope.cancel()
                else:
                    channel.name = f"coordinator<-worker {joined[0]}"
        finally:
            if not joined:
                self._strangers -= 1

    def _hello(self, message: Message, channel: FrameChannel, joined: list[int]) -> WorkerState:
        """Take ``message`` as a worker's ``hello`` on ``channel``, or refuse it."""
        body = message.body
        if not isinstance(body, Hello):
            why = f": {body.why}" if isinstance(body, Unreadable) else ""
            raise ProtocolRefusal(
                ErrorCode.CHECKPOINT_ERROR, f"a first message {message.kind[:64]!r}, not hello{why}"
            )
        index = body.index
        if not 0 <= index < self.workers:
            raise ProtocolRefusal(ErrorCode.CHECKPOINT_ERROR, f"no worker slot {shown(index)}")
        expected, given = self._secrets.get(index), body.secret
        if expected is None or given is None or not hmac.compare_digest(expected, given):
            raise ProtocolRefusal(ErrorCode.CHECKPOINT_ERROR, f"hello for worker {index} without its secret")
        current = self.channels.get(index)
        if current is not None and not current.closed:
            raise ProtocolRefusal(ErrorCode.CHECKPOINT_CONFLICT, f"worker {index} is connected already")
        url = body.url
        if url is not None and not _URL.fullmatch(url):
            raise ProtocolRefusal(ErrorCode.CHECKPOINT_ERROR, f"hello: {str(url)[:80]!r} is not an http URL")
        del self._secrets[index]  # one join per start
        joined.append(index)
        self._strangers -= 1
        channel.max_frame = self.max_frame
        self.channels[index] = channel
        if url is None:
            self.urls.pop(index, None)
        else:
            self.urls[index] = url
        channel.on_close = lambda: self._closed(index, channel)
        log.info("worker %d joined (pid %s)", index, body.pid)
        self.on_joined(index)
        self._joined.set()
        self._joined = anyio.Event()
        return self.state_provider()

    def _closed(self, index: int, channel: FrameChannel) -> None:
        if self.channels.get(index) is channel:
            self.urls.pop(index, None)
        if self.channels.get(index) is channel and not self.stopping:
            log.warning("worker %d lost: %s", index, channel.failure or "connection ended")
            self.on_lost(index)
