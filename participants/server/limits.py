"""Bounds on what a client can make a participant hold: request bodies, connections, idle time.

``BodyLimit`` is an ASGI middleware: a ``Content-Length`` over the bound is answered 413 before
anything is read, and a streamed body is counted chunk by chunk and cut off at the bound, so
no route ever buffers more than ``max_body_bytes``. A client that hangs up mid-body ends its
request quietly (no traceback). ``StopCutAnswered`` answers a request the server's stop cut
(its graceful-shutdown deadline, a forced exit) 503, not uvicorn's 500. ``server_limits()``
are the uvicorn settings ``serve``, the worker ports and the fleets use (connections under a
``connection_guard``);
``log_resource_exhaustion_once`` keeps "Too many open files" to one log line,
``log_shutdown_cuts_in_one_line`` each request cut at the graceful-shutdown deadline, and
``log_sink_os_errors_in_one_line`` a sink that failed for want of its disk or socket.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ckpt_events.participants.protocol import ErrorBody, ErrorDetail, encode
from ckpt_events.participants.server.connection_guard import ConnectionLimits, guarded_h11
from ckpt_events.participants.server.interrupts import FORCED_EXIT, UVICORN_CANCELS

__all__ = [
    "ACCEPT_LOGGERS",
    "DEFAULT_MAX_BODY_BYTES",
    "SHUTDOWN_CUT_LOGGER",
    "SINK_FAILURE_LOGGER",
    "STOP_CUT_CODE",
    "BodyLimit",
    "OsErrorInOneLine",
    "StopCutAnswered",
    "log_resource_exhaustion_once",
    "log_shutdown_cuts_in_one_line",
    "log_sink_os_errors_in_one_line",
    "server_limits",
]

#: The default bound on a request body: far above any control or work call.
DEFAULT_MAX_BODY_BYTES: Final = 8 * 1024 * 1024


def server_limits(connections: ConnectionLimits | None = None) -> dict[str, Any]:
    """uvicorn settings for one server: h11 under a fresh ``ConnectionGuard`` (header timeout,
    request deadline, per-peer caps: ``connections``), idle keep-alive connections closed after
    5 s, an incomplete HTTP head bounded to 64 KiB, and no WebSocket upgrades (no route uses them).

    Call it once per server: the guard's counts are that server's (``config.http.guard``)."""
    return {
        "http": guarded_h11(connections),
        "ws": "none",
        "timeout_keep_alive": 5,
        "h11_max_incomplete_event_size": 64 * 1024,
    }


class BodyLimit:
    """Refuse request bodies over ``max_body_bytes`` with 413 and the protocol's error body.

    Add it with ``app.add_middleware(BodyLimit, max_body_bytes=...)`` (as ``build_app`` does), so
    it runs inside Starlette's error middleware: wrapped around a whole Starlette app instead, a
    streamed body cut short at the limit reaches that middleware first and answers 500."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and (not value.isdigit() or int(value) > limit):
                await self._refuse(send)
                return
        received = 0
        started = False
        over = False

        async def counted_receive() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Reading stops here: to the route, the body ends as if the client hung up.
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, watched_send)
        except ClientDisconnect:
            if over and not started:
                await self._refuse(send)
            # else the client hung up mid-body: nobody is left to answer

    async def _refuse(self, send: Send) -> None:
        detail = f"request body over the {self.max_body_bytes}-byte bound"
        await _answer_error(send, 413, "payload_too_large", detail)


#: The error code of the reply to a request the server's stop cut (not a protocol code: as
#: ``payload_too_large``, the server's own answer, before or after any route).
STOP_CUT_CODE: Final = "server_stopping"


class StopCutAnswered:
    """Answer a request that the server's stop cancels before its response started (uvicorn's
    graceful-shutdown deadline, or a forced exit) 503 with ``Connection: close`` and an error
    body saying so, then let the cancellation go on (uvicorn then closes the connection).

    uvicorn answers any request its app raised out of, ``CancelledError`` too, 500 "Internal
    Server Error": read by a client as the handler's own failure. A ``CancelledError`` out of
    a task that is not being cancelled (a handler's own, from a future someone else cancelled)
    is left to uvicorn. No ``Retry-After``: whether, and when, a server serves here again is not
    this one's to know. A response already started is left as it is (uvicorn closes it)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not started and task is not None and task.cancelling():
                await _answer_stop_cut(send)
            raise


async def _answer_stop_cut(send: Send) -> None:
    detail = (
        "the server is stopping: its stop cut this request before it was answered (its "
        "graceful-shutdown deadline passed, or its exit was forced); send it again once a "
        "server runs here"
    )
    await _answer_error(send, 503, STOP_CUT_CODE, detail, close=True)


async def _answer_error(send: Send, status: int, code: str, detail: str, *, close: bool = False) -> None:
    """Answer ``status`` with the protocol's error body (``close``: and ``Connection: close``)."""
    body = encode(ErrorBody(error=ErrorDetail(code=code, detail=detail)))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Once(logging.Filter):
    """Let the first record about running out of descriptors through, without its traceback."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        # A tuple, or ``False``: uvloop logs a loop error that carries no exception (its "Task
        # was destroyed but it is pending!") with ``exc_info=False``, which failed this filter.
        if isinstance(record.exc_info, tuple) and record.exc_info[1] is not None:
            text += f": {record.exc_info[1]}"
        if "Too many open files" not in text and "out of system resource" not in text:
            return True
        if self.seen:
            return False
        self.seen = True
        record.msg = f"{text} (further such errors are not logged)"
        record.args = None
        record.exc_info = None
        record.exc_text = None
        return True


#: The loggers that report a failed ``accept()`` (asyncio's event loop, uvicorn).
ACCEPT_LOGGERS: Final = ("asyncio", "uvicorn.error")


def log_resource_exhaustion_once() -> logging.Filter:
    """Install (and return) the one-line filter on ``ACCEPT_LOGGERS``."""
    once = _Once()
    for name in ACCEPT_LOGGERS:
        logging.getLogger(name).addFilter(once)
    return once


class _ShutdownCut(logging.Filter):
    """The requests uvicorn cancels at its graceful-shutdown deadline (a prepare still waiting,
    a step still running), in one line per shutdown, with their count: uvicorn's own "Cancel N
    running task(s)" line is said as such, and the traceback uvicorn then logs for each
    cancelled request is dropped (the cut is the shutdown's doing, said once). It was one line
    per request: 512 requests busy at the deadline gave 257 lines.

    A forced exit (a second Ctrl-C during the shutdown) cancels what is left without a word: each
    request still running, and the app's lifespan before its sinks are closed. Each was a
    traceback of three chained exceptions, then one line each (3 requests cut: 5 lines with
    "interrupted"); the server's ``Interrupted`` says them all in its one line (``interrupts``),
    so each (and a request cancelled as a stop cut short ends) is a one-line DEBUG record, shown
    only at ``--log-level debug``."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info is not None else None
        text = str(record.msg)
        if text == UVICORN_CANCELS and isinstance(record.args, tuple) and len(record.args) == 1:
            record.msg = (
                f"{record.args[0]} request(s) still running at the shutdown deadline "
                "(timeout_graceful_shutdown) were cancelled"
            )
        elif isinstance(exc, asyncio.CancelledError) and "graceful shutdown" in str(exc):
            return False  # counted in the line above
        elif (
            isinstance(exc, asyncio.CancelledError) and text.startswith("Exception in 'lifespan' protocol")
        ) or (exc is None and _cancelled_traceback(text)):
            # The second: Starlette's lifespan sends its traceback as text ("shutdown failed").
            record.msg = (
                "the app's lifespan was cancelled before it ended (the exit was forced): events "
                "not yet written or exported may be lost"
            )
            return _as_debug(record)
        elif isinstance(exc, asyncio.CancelledError) and text.startswith("Exception in ASGI application"):
            if str(exc) == FORCED_EXIT:  # ours: counted and named in the server's one line
                record.msg = "a request still running when the exit was forced was cancelled"
            else:
                # Left running by a stop that was cut short: a ``--workers`` worker whose server's
                # exit was forced (its coordinator gone) cancels them as it ends; they logged
                # one ERROR line each after the server's one line (1 or 2 of 2 held, by timing).
                record.msg = "a request still running when its server stopped was cancelled"
            return _as_debug(record)
        else:
            return True
        record.args = None
        record.exc_info = None
        record.exc_text = None
        return True


def _as_debug(record: logging.LogRecord) -> bool:
    """``record`` made a one-line DEBUG record; whether its logger shows DEBUG (else dropped)."""
    record.args = None
    record.exc_info = None
    record.exc_text = None
    record.levelno = logging.DEBUG
    record.levelname = logging.getLevelName(logging.DEBUG)
    return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def _cancelled_traceback(text: str) -> bool:
    """Whether ``text`` is a formatted traceback ending in a ``CancelledError``."""
    if not text.startswith("Traceback (most recent call last)"):
        return False
    last = text.rstrip().rpartition("\n")[2]
    return last.startswith(("asyncio.exceptions.CancelledError", "CancelledError"))


#: The logger on which uvicorn reports a request whose app raised (or was cancelled).
SHUTDOWN_CUT_LOGGER: Final = "uvicorn.error"


def log_shutdown_cuts_in_one_line() -> logging.Filter:
    """Install (once; returns it) the filter that says each request cut at uvicorn's
    graceful-shutdown deadline in one line instead of a traceback of the whole ASGI stack."""
    logger = logging.getLogger(SHUTDOWN_CUT_LOGGER)
    installed = next((f for f in logger.filters if isinstance(f, _ShutdownCut)), None)
    if installed is None:
        installed = _ShutdownCut()
        logger.addFilter(installed)
    return installed


class OsErrorInOneLine(logging.Filter):
    """The bus's "sink failed" record, when the sink failed for want of its file, disk or
    socket (an ``OSError``), as one line ending with that error: its traceback (the JSON-lines
    writer's stack on a full disk, a dozen lines) said no more than the error does."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info is not None else None
        if isinstance(exc, OSError):
            record.msg = f"{record.getMessage()}: {exc}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


#: The logger on which the bus reports a sink that raised.
SINK_FAILURE_LOGGER: Final = "ckpt_events"


def log_sink_os_errors_in_one_line() -> logging.Filter:
    """Install (once; returns it) ``OsErrorInOneLine`` on the bus's logger, for a process's
    whole life (``serve``, each of its workers)."""
    logger = logging.getLogger(SINK_FAILURE_LOGGER)
    installed = next((f for f in logger.filters if isinstance(f, OsErrorInOneLine)), None)
    if installed is None:
        installed = OsErrorInOneLine()
        logger.addFilter(installed)
    return installed
