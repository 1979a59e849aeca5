"""BodyLimit's 413 before and while reading, server_limits' settings, the one-line log filters."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from collections.abc import AsyncIterator, Iterator

import anyio
import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from ckpt_events.participants import create_app
from ckpt_events.participants.protocol import CONTROL_PREFIX
from ckpt_events.participants.server.connection_guard import ConnectionLimits
from ckpt_events.participants.server.limits import (
    ACCEPT_LOGGERS,
    DEFAULT_MAX_BODY_BYTES,
    SHUTDOWN_CUT_LOGGER,
    BodyLimit,
    log_resource_exhaustion_once,
    log_shutdown_cuts_in_one_line,
    server_limits,
)
from tests.participants.helpers import AUTH, ROOT, TOKEN, body

LIMIT = 100


def _echo_app() -> FastAPI:
    """A route answering the length of the body it read, behind ``BodyLimit`` as ``build_app``
    adds it (inside Starlette's error middleware)."""
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"read": len(await request.body())}

    app.add_middleware(BodyLimit, max_body_bytes=LIMIT)
    return app


def _client(app: ASGIApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def _refusal() -> dict[str, object]:
    return {"error": {"code": "payload_too_large", "detail": f"request body over the {LIMIT}-byte bound"}}


async def _chunks(count: int, size: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        yield b"z" * size


async def test_a_body_at_the_bound_reaches_the_route() -> None:
    """Exactly max_body_bytes, declared or streamed, is read in full by the route."""
    async with _client(_echo_app()) as client:
        reply = await client.post("/echo", content=b"x" * LIMIT)
        assert (reply.status_code, reply.json()) == (200, {"read": LIMIT})
        reply = await client.post("/echo", content=_chunks(4, LIMIT // 4))
        assert (reply.status_code, reply.json()) == (200, {"read": LIMIT})


async def test_a_declared_length_over_the_bound_is_413_before_the_app_runs() -> None:
    """A Content-Length over the bound is answered 413 with the protocol's error body; the app never runs."""
    called: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        called.append(scope)

    async with _client(BodyLimit(app, max_body_bytes=LIMIT)) as client:
        reply = await client.post("/anything", content=b"x" * (LIMIT + 1))
    assert reply.status_code == 413 and called == []
    assert reply.headers["content-type"] == "application/json"
    assert json.loads(reply.content) == _refusal()
    assert int(reply.headers["content-length"]) == len(reply.content)


async def test_a_content_length_that_is_not_a_number_is_refused() -> None:
    """A non-digit Content-Length cannot be bounded: it is refused with 413 too."""
    async with _client(_echo_app()) as client:
        reply = await client.post("/echo", content=b"{}", headers={"content-length": "-1"})
    assert reply.status_code == 413 and reply.json() == _refusal()


async def test_a_streamed_body_is_cut_off_at_the_bound() -> None:
    """Without a length, a body is counted chunk by chunk: one byte over is 413, never buffered whole."""
    async with _client(_echo_app()) as client:
        reply = await client.post("/echo", content=_chunks(101, 1))
        assert reply.status_code == 413 and reply.json() == _refusal()
        reply = await client.post("/echo", content=_chunks(1000, 50))
        assert reply.status_code == 413


async def test_a_route_that_answered_before_the_bound_keeps_its_answer() -> None:
    """A route that replies without reading the body is unaffected by an over-long stream."""
    app = FastAPI()

    @app.post("/ignore")
    async def ignore() -> dict[str, bool]:
        return {"ok": True}

    app.add_middleware(BodyLimit, max_body_bytes=LIMIT)
    async with _client(app) as client:
        reply = await client.post("/ignore", content=_chunks(10, 50))
    assert (reply.status_code, reply.json()) == (200, {"ok": True})


async def test_a_non_http_scope_passes_through() -> None:
    """A lifespan (or any non-HTTP) scope goes to the app untouched."""
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])
        await send({"type": "lifespan.startup.complete"})

    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "lifespan.startup"}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    await BodyLimit(app, max_body_bytes=1)({"type": "lifespan"}, receive, send)  # type: ignore[arg-type]
    assert seen == ["lifespan"] and sent == [{"type": "lifespan.startup.complete"}]


def test_the_default_body_bound_is_8_mib() -> None:
    """DEFAULT_MAX_BODY_BYTES is 8 MiB."""
    assert DEFAULT_MAX_BODY_BYTES == 8 * 1024 * 1024


def test_server_limits_are_the_uvicorn_settings() -> None:
    """Guarded h11 with the given limits, no WebSockets, 5 s keep-alive, a 64 KiB head bound."""
    limits = ConnectionLimits(header_timeout=2.0, max_connections=7)
    settings = server_limits(limits)
    assert settings["ws"] == "none"
    assert settings["timeout_keep_alive"] == 5
    assert settings["h11_max_incomplete_event_size"] == 64 * 1024
    assert set(settings) == {"http", "ws", "timeout_keep_alive", "h11_max_incomplete_event_size"}
    assert settings["http"].guard.limits == limits


@pytest.fixture
def once() -> Iterator[logging.Filter]:
    """The installed filter, removed again from ACCEPT_LOGGERS afterwards."""
    installed = log_resource_exhaustion_once()
    try:
        yield installed
    finally:
        for name in ACCEPT_LOGGERS:
            logging.getLogger(name).removeFilter(installed)


def _record(msg: str, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = None if exc is None else (type(exc), exc, None)
    return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, exc_info)


def test_a_uvloop_error_without_an_exception_is_logged_as_itself(
    once: logging.Filter, caplog: pytest.LogCaptureFixture
) -> None:
    """uvloop logs a loop error that has no exception (its "Task was destroyed but it is
    pending!") with ``exc_info=False``: the filter indexed it, so the line was lost and
    replaced by "Exception in default exception handler" and a TypeError traceback."""
    uvloop = pytest.importorskip("uvloop")
    loop = uvloop.new_event_loop()
    try:
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            loop.call_exception_handler({"message": "a loop error with no exception"})
    finally:
        loop.close()
    assert [r.getMessage() for r in caplog.records] == ["a loop error with no exception"]


def test_the_filter_is_installed_on_every_accept_logger(once: logging.Filter) -> None:
    """One filter object on asyncio's and uvicorn's error loggers."""
    assert ACCEPT_LOGGERS == ("asyncio", "uvicorn.error")
    for name in ACCEPT_LOGGERS:
        assert once in logging.getLogger(name).filters


def test_the_filter_lets_one_exhaustion_record_through_stripped(once: logging.Filter) -> None:
    """The first record about running out (in its message or its exception) passes without its
    traceback and says later ones are dropped; the later ones are dropped; others pass untouched."""
    first = _record("socket.accept() failed", OSError(24, "Too many open files"))
    assert once.filter(first)
    assert first.exc_info is None and first.args is None
    # The exception's text is kept in the one line (the traceback is not).
    assert first.msg == (
        "socket.accept() failed: [Errno 24] Too many open files (further such errors are not logged)"
    )
    assert not once.filter(_record("accept() out of system resource"))
    assert not once.filter(_record("x", OSError(24, "Too many open files")))
    other = _record("some other error %s", ValueError("boom"))
    assert once.filter(other) and other.exc_info is not None and other.msg == "some other error %s"


async def test_a_prepare_cut_at_the_shutdown_deadline_is_one_line_not_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A real uvicorn server stopping while a prepare waits on a running step: uvicorn cancels
    both requests at its graceful-shutdown deadline, and each is said in one line."""
    installed = log_shutdown_cuts_in_one_line()
    assert log_shutdown_cuts_in_one_line() is installed  # installed once
    app = create_app(
        "environment", instance="environment-0", token=TOKEN, checkpoint_root=ROOT, step_seconds=60
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    # log_config=None: uvicorn leaves its loggers propagating, to caplog.
    config = uvicorn.Config(
        app, lifespan="on", log_config=None, timeout_graceful_shutdown=0, **server_limits()
    )
    server = uvicorn.Server(config)
    try:
        async with anyio.create_task_group() as tg, httpx.AsyncClient(base_url=url, headers=AUTH) as client:
            tg.start_soon(server.serve, [sock])
            while not server.started:
                await anyio.sleep(0.01)
            await client.post("/work/start", json={"rollout_id": "r1", "steps": 2})

            async def post(path: str, payload: dict[str, object]) -> None:
                with contextlib.suppress(httpx.HTTPError):  # a 500, or the connection closed
                    await client.post(path, json=payload)

            tg.start_soon(post, "/work/advance", {"rollout_id": "r1"})  # a 60 s step
            await anyio.sleep(0.1)
            tg.start_soon(post, f"{CONTROL_PREFIX}/prepare", body(seconds=60))  # waits on it
            await anyio.sleep(0.2)
            server.should_exit = True
    finally:
        logging.getLogger(SHUTDOWN_CUT_LOGGER).removeFilter(installed)
        sock.close()
    cut = [r for r in caplog.records if r.name == SHUTDOWN_CUT_LOGGER and r.levelno == logging.ERROR]
    assert [r.getMessage() for r in cut if r.exc_info is None] == [
        "2 request(s) still running at the shutdown deadline (timeout_graceful_shutdown) were cancelled",
    ]
    assert all(r.exc_info is None for r in cut)


async def test_a_hundred_requests_cut_at_the_shutdown_deadline_are_one_line_with_their_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A real uvicorn server stopping with 100 requests busy: one line saying 100, not one per
    request (512 busy requests gave 257 lines)."""
    installed = log_shutdown_cuts_in_one_line()
    busy = 100
    started: list[str] = []
    app = FastAPI()

    @app.get("/busy/{n}")
    async def slow(n: str) -> dict[str, str]:
        started.append(n)
        await anyio.sleep(60)
        return {"n": n}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = uvicorn.Config(app, lifespan="off", log_config=None, timeout_graceful_shutdown=0)
    server = uvicorn.Server(config)
    limits = httpx.Limits(max_connections=busy + 10)
    try:
        with anyio.fail_after(20):
            async with (
                anyio.create_task_group() as tg,
                httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client,
            ):
                tg.start_soon(server.serve, [sock])
                while not server.started:
                    await anyio.sleep(0.01)

                async def get(n: int) -> None:
                    with contextlib.suppress(httpx.HTTPError):  # the connection closed
                        await client.get(f"/busy/{n}")

                for n in range(busy):
                    tg.start_soon(get, n)
                while len(started) < busy:
                    await anyio.sleep(0.01)
                server.should_exit = True
    finally:
        logging.getLogger(SHUTDOWN_CUT_LOGGER).removeFilter(installed)
        sock.close()
    said = [
        r.getMessage() for r in caplog.records if r.name == SHUTDOWN_CUT_LOGGER and r.levelno >= logging.ERROR
    ]
    assert said == [
        f"{busy} request(s) still running at the shutdown deadline (timeout_graceful_shutdown) were cancelled"
    ]
