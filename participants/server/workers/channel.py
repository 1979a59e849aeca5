"""``FrameChannel``: one connection between the coordinator and a worker, both ways.

Either side sends messages and answers the other's. Frames go out in the order they were
queued (``post`` and ``request`` share one queue), so a sync ``post`` (admission, marks) is
seen by the peer before anything queued after it. Requests of an ``inline`` kind are handled
one at a time in arrival order; the others each run in their own task, and each handler can
read when its message arrived (``current_arrival``). ``request`` returns the reply decoded as
the request's reply type (``frames.reply_type``). A bad frame ends the channel (the peer is
lost); a reply to an id nobody waits for, or a message of an unknown kind, is a protocol error
that is logged and refused, and the channel goes on. A reply that comes after its request gave
up waiting is logged once as late, and dropped; a reply that is not of its request's type is
the peer's fault (``WorkerChannelError``).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Final, TypeVar

import anyio
import msgspec
from anyio.abc import ByteStream, TaskGroup

from ckpt_events.checks import fit_for_log, library_logger, said_in_log
from ckpt_events.participants.errors import (
    ProtocolRefusal,
    WorkerChannelError,
    failure_detail,
    fitted_detail,
    shown,
)
from ckpt_events.participants.server.workers.frames import (
    DEFAULT_MAX_FRAME,
    FrameError,
    Message,
    Reply,
    Request,
    decode_reply,
    encode_body,
    encode_frame,
    read_frame,
)
from ckpt_events.participants.server.workers.socket_stream import loop_socket_stream
from ckpt_events.vocab import ErrorCode

__all__ = ["DEFAULT_REPLY_SECONDS", "FrameChannel", "Handler", "UnknownKind", "current_arrival"]

log = library_logger("ckpt_events.workers")

#: How long a request waits for its reply before the peer counts as unavailable.
DEFAULT_REPLY_SECONDS: Final = 30.0
#: Requests given up on (no reply in time) whose late reply is logged as late, not as a
#: protocol error; older ones are forgotten (a peer is lost long before it lags 64 behind).
_GIVEN_UP_KEPT: Final = 64
#: Protocol errors logged per channel; the rest are counted (``protocol_errors``) and the
#: count is logged once when the channel closes, so a hostile peer cannot flood the log.
LOGGED_PROTOCOL_ERRORS: Final = 10
#: The longest text of a failed handler's exception a reply carries.
_FAILED_DETAIL_CHARS: Final = 500
Handler = Callable[[Message], Awaitable[Any]]
R = TypeVar("R")


#: What a handler raises for a message kind it does not know (answered 400 ``unknown_kind``).
UnknownKind = WorkerChannelError

_ARRIVAL: Final[ContextVar[int | None]] = ContextVar("ckpt_events_frame_arrival", default=None)


def current_arrival() -> int | None:
    """When the message being handled was read off the socket (Unix ns), inside a handler: the
    frames' ``received_ns``, as the HTTP middleware's is the request's. None elsewhere."""
    return _ARRIVAL.get()


class _Pending:
    __slots__ = ("done", "reply")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.reply: Reply | None = None


class FrameChannel:
    """Frames over ``stream``; ``run()`` reads and writes until the stream ends or a frame is bad."""

    def __init__(
        self,
        stream: ByteStream,
        handler: Handler,
        *,
        name: str,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        # A Unix socket is read by the loop's own socket calls: anyio's raise InvalidStateError
        # in a loop callback when a read is cancelled as its socket turns readable (socket_stream).
        self.stream = loop_socket_stream(stream)
        self.name = name
        self.max_frame = max_frame
        self.closed = False
        self.failure: str | None = None
        self._handler = handler
        self._next_id = 0
        self._pending: dict[int, _Pending | None] = {}
        self._given_up: OrderedDict[int, str] = OrderedDict()  # id -> kind, for a late reply
        send, outbox = anyio.create_memory_object_stream[bytes](math.inf)
        self._send = send
        self._outbox = outbox
        self._ended = anyio.Event()
        #: Called once when the channel closes (the coordinator marks the worker lost there).
        self.on_close: Callable[[], None] | None = None
        #: Protocol errors seen (unknown message kinds, replies to unknown ids).
        self.protocol_errors = 0
        self._finishing = False  # finish(): what is queued goes out, nothing more is queued
        self._run_scope: anyio.CancelScope | None = None

    def _protocol_error(self, message: str, *args: object) -> None:
        self.protocol_errors += 1
        if self.protocol_errors <= LOGGED_PROTOCOL_ERRORS:
            log.error("%s: protocol error: " + message, self.name, *args)
        if self.protocol_errors == LOGGED_PROTOCOL_ERRORS:
            log.error("%s: further protocol errors are counted, not logged", self.name)

    # -- sending ----------------------------------------------------------------------------

    def _queue(self, body: Request[Any], traceparent: str | None, waiter: _Pending | None) -> int:
        if self.closed or self._finishing:
            raise WorkerChannelError(f"{self.name}: channel is closed ({self.failure or 'ended'})")
        self._next_id += 1
        message_id = self._next_id
        data = encode_frame(Message(message_id, body, traceparent), self.max_frame)
        self._pending[message_id] = waiter
        self._send.send_nowait(data)
        return message_id

    def post(self, body: Request[Any], traceparent: str | None = None) -> None:
        """Queue a message whose reply nobody awaits (raises if the channel is closed)."""
        self._queue(body, traceparent, None)

    async def request(
        self,
        body: Request[R],
        *,
        timeout: float = DEFAULT_REPLY_SECONDS,
        traceparent: str | None = None,
    ) -> R:
        """Send and await the reply, as ``body``'s reply type; a refusal is raised as
        ``ProtocolRefusal``; no reply within ``timeout`` (or a closed channel), or a reply of
        another type, as ``WorkerChannelError``."""
        kind = body.kind
        waiter = _Pending()
        message_id = self._queue(body, traceparent, waiter)
        try:
            with anyio.move_on_after(timeout):
                await waiter.done.wait()
        finally:
            self._pending.pop(message_id, None)
        reply = waiter.reply
        if reply is None:
            if not self.closed:
                self._given_up[message_id] = kind
                if len(self._given_up) > _GIVEN_UP_KEPT:
                    self._given_up.popitem(last=False)
            # To the hundredth: a deadline's remaining time read "no reply within 4.99668 s".
            reason = self.failure or "ended" if self.closed else f"no reply within {round(timeout, 2):g} s"
            raise WorkerChannelError(f"{self.name}: {kind}: {reason}")
        if reply.ok:
            try:
                return decode_reply(type(body), reply.body)
            except msgspec.DecodeError as exc:
                raise WorkerChannelError(f"{self.name}: {kind}: a bad reply: {exc}") from None
        error = reply.error or FrameError(500, ErrorCode.CHECKPOINT_ERROR.value, "refused without a reason")
        if error.code in ErrorCode.__members__.values():
            raise ProtocolRefusal(error.code, error.detail)
        raise WorkerChannelError(f"{self.name}: {kind} refused: {error.code}: {error.detail}")

    def _reply(self, reply: Reply) -> None:
        if not self.closed and not self._finishing:
            try:
                self._send.send_nowait(encode_frame(reply, self.max_frame))
            except WorkerChannelError as exc:
                log.error("%s: reply to %d not sent: %s", self.name, reply.reply_to, said_in_log(exc))
                self._send.send_nowait(encode_frame(_error_reply(reply.reply_to, exc), self.max_frame))

    # -- receiving --------------------------------------------------------------------------

    async def _answer(self, message: Message, received_ns: int) -> None:
        # Set in the handler's own task (or, inline, just before it): nothing leaks across.
        _ARRIVAL.set(received_ns)
        try:
            value = await self._handler(message)
        except ProtocolRefusal as exc:
            self._reply(Reply(message.id, False, error=FrameError(exc.status, exc.code.value, exc.detail)))
        except UnknownKind:
            self._protocol_error("unknown message kind %r", message.kind[:64])
            detail = f"unknown message kind {shown(message.kind)}"
            self._reply(Reply(message.id, False, error=FrameError(400, "unknown_kind", detail)))
        except Exception as exc:
            # Fitted, as the library's own records are: a handler's error may quote a payload
            # or a URL with its user:password, and the traceback goes to the server's log.
            log.error("%s: %s failed", self.name, message.kind, exc_info=fit_for_log(exc))
            self._reply(_error_reply(message.id, exc))
        else:
            self._reply(Reply(message.id, True, encode_body(value)))

    async def _read(self, tg: TaskGroup) -> None:
        while True:
            frame = await read_frame(self.stream, self.max_frame)
            if frame is None:
                return
            received_ns = time.time_ns()
            if isinstance(frame, Reply):
                if frame.reply_to not in self._pending:
                    if (kind := self._given_up.pop(frame.reply_to, None)) is not None:
                        log.warning(
                            "%s: late reply to %s %d, given up on before it came: dropped",
                            self.name,
                            kind,
                            frame.reply_to,
                        )
                    else:
                        self._protocol_error("reply to unknown id %d", frame.reply_to)
                    continue
                waiter = self._pending.pop(frame.reply_to)
                if waiter is not None:
                    waiter.reply = frame
                    waiter.done.set()
            elif frame.body.inline:
                await self._answer(frame, received_ns)
            else:
                tg.start_soon(self._answer, frame, received_ns)

    async def _write(self) -> None:
        try:
            async for data in self._outbox:
                await self.stream.send(data)
        except anyio.ClosedResourceError:
            return  # close() from outside while running: nothing more goes out, run() ends
        if self._finishing and self._run_scope is not None:
            # finish(): everything queued went out; now the read is cancelled and run() closes
            # the stream (never closed under a pending read: anyio's Unix stream races on that).
            self._run_scope.cancel()

    def finish(self) -> None:
        """Send what is queued (a refused peer gets its answer), then close the channel."""
        if not self.closed and not self._finishing:
            self._finishing = True
            self._send.close()

    async def run(self) -> None:
        """Serve the channel until the peer ends it or sends a bad frame; then close it."""
        try:
            async with anyio.create_task_group() as tg:
                self._run_scope = tg.cancel_scope
                tg.start_soon(self._write)
                try:
                    await self._read(tg)
                except WorkerChannelError as exc:
                    self.failure = str(exc)
                    log.error("%s: protocol error: %s; dropping the peer", self.name, said_in_log(exc))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
                    self.failure = f"connection lost: {exc!r}"
                tg.cancel_scope.cancel()
        except* (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as lost:
            # A write to a gone peer fails in ``_write``'s task, so it comes wrapped in the task
            # group's ExceptionGroup; anything else in the group (cancellation too) goes on up.
            self.failure = self.failure or f"connection lost: {lost.exceptions[0]!r}"
        finally:
            await self.aclose()

    def close(self) -> None:
        """End the channel: pending requests fail at once (``aclose`` also closes the stream)."""
        if self.closed:
            return
        self.closed = True
        self._send.close()
        self._outbox.close()
        for waiter in self._pending.values():
            if waiter is not None:
                waiter.done.set()
        self._pending.clear()
        self._ended.set()
        if self.protocol_errors > LOGGED_PROTOCOL_ERRORS:
            log.error("%s: %d protocol errors in all", self.name, self.protocol_errors)
        if self.on_close is not None:
            self.on_close()

    async def aclose(self) -> None:
        self.close()
        with anyio.CancelScope(shield=True):
            await self.stream.aclose()

    async def wait_closed(self) -> None:
        await self._ended.wait()


def _error_reply(message_id: int, exc: BaseException) -> Reply:
    # Redacted before the cut (a URL's user:password across it was cut where the redaction rule
    # no longer sees it); the main process answers it through ``error_reply_body`` as well.
    detail = fitted_detail(failure_detail(exc), _FAILED_DETAIL_CHARS, sized=False)
    return Reply(message_id, False, error=FrameError(500, ErrorCode.CHECKPOINT_ERROR.value, detail))
