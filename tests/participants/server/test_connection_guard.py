"""The connection guard under real uvicorn and real sockets: header timeout, request deadline,
stalled sends, displacement of waiting connections, and the 503s when everything is busy."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator

import anyio
import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ckpt_events import InvalidValueError
from ckpt_events.participants.server.connection_guard import (
    ConnectionGuard,
    ConnectionLimits,
    GuardedH11Protocol,
    guarded_h11,
)
from ckpt_events.participants.server.limits import server_limits

#: The tests of refused, displaced and cut connections run under uvloop too: uvicorn picks it
#: when it is installed (``uvicorn[standard]`` installs it), and its transports differ.
BOTH_LOOPS = pytest.mark.parametrize(
    "anyio_backend",
    [
        pytest.param("asyncio", id="asyncio"),
        pytest.param(
            ("asyncio", {"use_uvloop": True}),
            id="uvloop",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("uvloop") is None,
                reason="uvloop is not installed (pip install uvloop)",
            ),
        ),
    ],
)

#: Small timeouts keep each test under a few seconds; the defaults are 5 s and 30 s.
QUICK = ConnectionLimits(header_timeout=0.4, request_timeout=0.8, send_timeout=0.5)


class _Embedded(uvicorn.Server):
    # Signals stay with pytest.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Seen:
    """What the test app saw: bodies cut off by a disconnect; ``release`` ends every ``/hold``."""

    def __init__(self) -> None:
        self.disconnects = 0
        self.release = anyio.Event()


def _app(seen: Seen) -> Starlette:
    async def ping(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def slow(request: Request) -> Response:
        await anyio.sleep(float(request.query_params.get("s", "1")))
        return PlainTextResponse("slept")

    async def hold(request: Request) -> Response:
        with anyio.fail_after(10):
            await seen.release.wait()
        return PlainTextResponse("held")

    async def echo(request: Request) -> Response:
        try:
            return PlainTextResponse(str(len(await request.body())))
        except ClientDisconnect:
            seen.disconnects += 1
            raise

    async def big(request: Request) -> Response:
        return Response(b"x" * (64 * 1024 * 1024))

    routes = [
        Route("/ping", ping),
        Route("/slow", slow),
        Route("/hold", hold),
        Route("/echo", echo, methods=["POST"]),
        Route("/big", big),
    ]
    return Starlette(routes=routes)


@contextlib.asynccontextmanager
async def guarded(limits: ConnectionLimits = QUICK) -> AsyncIterator[tuple[int, ConnectionGuard, Seen]]:
    """A real uvicorn server on 127.0.0.1 under ``limits``: (port, its guard, what the app saw)."""
    seen = Seen()
    settings = server_limits(limits)
    protocol: type[GuardedH11Protocol] = settings["http"]
    config = uvicorn.Config(_app(seen), lifespan="off", log_level="warning", access_log=False, **settings)
    server = _Embedded(config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    ended = anyio.Event()

    async def serve() -> None:
        try:
            await server.serve([sock])
        finally:
            ended.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(serve)
            with anyio.fail_after(5):
                while not server.started:
                    await anyio.sleep(0.01)
            try:
                yield sock.getsockname()[1], protocol.guard, seen
            finally:
                server.should_exit = True
                server.force_exit = True
                # Let it shut down before a failure cancels it: cancelled, its listening socket
                # stays open, and under uvloop with warnings as errors, closing the loop then
                # hung for ever (uvloop's ResourceWarning for it raised in its close).
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await ended.wait()
    finally:
        sock.close()


@contextlib.asynccontextmanager
async def _connected(port: int, count: int = 1) -> AsyncIterator[list[anyio.abc.SocketStream]]:
    """``count`` TCP connections to ``port``, all closed on exit."""
    streams: list[anyio.abc.SocketStream] = []
    try:
        for _ in range(count):
            streams.append(await anyio.connect_tcp("127.0.0.1", port))
        yield streams
    finally:
        for stream in streams:
            await stream.aclose()


async def _trickle(stream: anyio.abc.SocketStream, data: bytes, every: float) -> None:
    for byte in data:
        try:
            await stream.send(bytes([byte]))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            return
        await anyio.sleep(every)


async def _closed_within(stream: anyio.abc.SocketStream, seconds: float) -> bytes:
    """Everything the server sends until it closes ``stream``; fails after ``seconds``."""
    got = b""
    with anyio.fail_after(seconds):
        while True:
            try:
                got += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return got


def test_limits_are_checked() -> None:
    """A zero timeout or cap is refused when the limits are built."""
    with pytest.raises(InvalidValueError, match="header_timeout"):
        ConnectionLimits(header_timeout=0)
    with pytest.raises(InvalidValueError, match="max_per_peer"):
        ConnectionLimits(max_per_peer=0)


def test_each_server_gets_its_own_guard() -> None:
    """Two calls, two protocol classes, two guards: counts never mix between servers."""
    assert guarded_h11().guard is not guarded_h11().guard
    assert server_limits()["http"].guard is not server_limits()["http"].guard


async def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout() -> None:
    """No bytes at all: closed quietly (no 408) once ``header_timeout`` has passed."""
    async with guarded() as (port, guard, _):
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            started = time.monotonic()
            assert await _closed_within(stream, 3.0) == b""
        assert 0.3 < time.monotonic() - started < 1.5
        assert guard.stats().header_timeouts == 1
        assert guard.stats().open == 0


async def test_a_head_trickled_byte_by_byte_gets_408_at_the_header_timeout() -> None:
    """Slowloris: a byte every 0.1 s never resets the clock; the head's deadline is absolute."""
    head = b"GET /ping HTTP/1.1\r\nHost: x\r\n" + b"X-a: b\r\n" * 20
    async with guarded() as (port, guard, _), _connected(port) as (stream,):
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_trickle, stream, head, 0.1)
            reply = await _closed_within(stream, 3.0)
            tg.cancel_scope.cancel()
        assert reply.startswith(b"HTTP/1.1 408 ")
        assert time.monotonic() - started < 1.5
        assert guard.stats().header_timeouts == 1


@BOTH_LOOPS
async def test_a_body_slower_than_the_request_deadline_is_cut_off() -> None:
    """A complete head, then a body trickled past ``request_timeout``: the connection is aborted
    and the route sees the client gone."""
    async with guarded() as (port, guard, seen), _connected(port) as (stream,):
        started = time.monotonic()
        await stream.send(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        async with anyio.create_task_group() as tg:
            tg.start_soon(_trickle, stream, b"y" * 1000, 0.05)
            await _closed_within(stream, 3.0)
            tg.cancel_scope.cancel()
        assert 0.6 < time.monotonic() - started < 2.0
        assert guard.stats().request_timeouts == 1
        await anyio.sleep(0.1)
        assert seen.disconnects == 1


async def test_a_route_may_run_past_the_deadlines_once_its_request_is_in() -> None:
    """The deadlines bound reading the request, not the route: a 1.2 s route answers 200."""
    async with guarded() as (port, guard, _), httpx.AsyncClient() as client:
        reply = await client.get(f"http://127.0.0.1:{port}/slow", params={"s": "1.2"})
        assert reply.status_code == 200 and reply.text == "slept"
        assert guard.stats().request_timeouts == 0


async def test_keep_alive_requests_each_get_a_fresh_header_clock() -> None:
    """Requests on one connection, each after a pause shorter than the header timeout, all answer
    on that connection; after a longer pause it is closed (the client reconnects)."""
    async with guarded() as (port, guard, _), _connected(port) as (stream,):
        for _ in range(4):
            await anyio.sleep(0.25)  # 4 x 0.25 s > 0.4 s: only a per-request clock allows this
            await stream.send(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
            with anyio.fail_after(2):
                reply = b""
                while not reply.endswith(b"ok"):
                    reply += await stream.receive()
            assert reply.startswith(b"HTTP/1.1 200 ")
        assert await _closed_within(stream, 2.0) == b""
        assert guard.stats().header_timeouts == 1


@BOTH_LOOPS
async def test_a_client_that_stops_reading_a_response_is_cut_off() -> None:
    """A 64 MiB reply to a client that reads nothing: writes stall, the connection is aborted
    after ``send_timeout``."""
    async with guarded() as (port, guard, _):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            with anyio.fail_after(5):
                while guard.stats().send_timeouts == 0:
                    await anyio.sleep(0.05)
            assert guard.stats().open == 0


@BOTH_LOOPS
async def test_idle_connections_from_one_peer_cannot_keep_requests_out() -> None:
    """520 idle connections (over the 512 and the per-peer 256): requests still answer 200 (once
    the idle ones are ``displace_after`` old), the oldest idle ones are displaced, and every idle
    one is closed by the header timeout."""
    limits = ConnectionLimits(header_timeout=2.0)
    async with guarded(limits) as (port, guard, _):
        async with _connected(port, 520) as idle:
            await anyio.sleep(limits.displace_after)  # until then the newest are not displaced
            statuses = []
            async with httpx.AsyncClient(timeout=5) as client:
                for _ in range(20):
                    statuses.append((await client.get(f"http://127.0.0.1:{port}/ping")).status_code)
            assert statuses == [200] * 20
            stats = guard.stats()
            # Past the per-peer 256, a newcomer was refused or displaced an idle one, unless the
            # header timeout had closed one first (connecting 520 can take longer than that
            # timeout on a loaded machine: a run beside another test once saw 256 of them).
            assert stats.displaced > 0
            assert stats.displaced + stats.refused + stats.header_timeouts >= 520 - 256, stats
            with anyio.fail_after(8):
                for stream in idle:
                    await _closed_within(stream, 8)
        assert guard.stats().open == 0 and guard.stats().waiting == 0


@BOTH_LOOPS
async def test_a_connection_past_the_caps_when_all_are_busy_gets_503() -> None:
    """Two connections busy with requests fill ``max_connections=2``: the third is answered 503
    (code ``overloaded``) at once, nothing busy is displaced, and the busy ones finish 200."""
    limits = ConnectionLimits(header_timeout=1.0, max_connections=2)
    async with guarded(limits) as (port, guard, _):
        limit = httpx.Limits(max_connections=3, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=5, limits=limit) as client:
            replies: list[httpx.Response] = []

            async def slow() -> None:
                replies.append(await client.get(f"http://127.0.0.1:{port}/slow", params={"s": "0.6"}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(slow)
                tg.start_soon(slow)
                await anyio.sleep(0.2)
                extra = await client.get(f"http://127.0.0.1:{port}/ping")
                assert extra.status_code == 503
                assert extra.json()["error"]["code"] == "overloaded"
            assert [r.status_code for r in replies] == [200, 200]
        stats = guard.stats()
        assert stats.refused == 1 and stats.displaced == 0


async def test_requests_past_max_requests_get_503() -> None:
    """``max_requests=2``: the third request running at once is answered 503 ``overloaded``."""
    limits = ConnectionLimits(header_timeout=1.0, max_requests=2)
    async with guarded(limits) as (port, guard, _):
        async with httpx.AsyncClient(timeout=5) as client:
            codes: list[int] = []

            async def slow() -> None:
                codes.append(
                    (await client.get(f"http://127.0.0.1:{port}/slow", params={"s": "0.5"})).status_code
                )

            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(slow)
        assert sorted(codes) == [200, 200, 503]
        assert guard.stats().overloaded == 1


@BOTH_LOOPS
async def test_a_connection_just_made_is_not_displaced() -> None:
    """Past the cap, a connection younger than ``displace_after`` (its head may be unread) is
    kept and the newcomer answered 503; once it has waited that long, the newcomer displaces it."""
    limits = ConnectionLimits(header_timeout=2.0, max_connections=4, displace_after=0.3)
    async with guarded(limits) as (port, guard, _), _connected(port, 4):
        async with httpx.AsyncClient(timeout=5) as client:
            early = await client.get(f"http://127.0.0.1:{port}/ping")
            await anyio.sleep(0.35)
            late = await client.get(f"http://127.0.0.1:{port}/ping")
        assert (early.status_code, early.json()["error"]["code"]) == (503, "overloaded")
        assert late.status_code == 200
        stats = guard.stats()
        assert (stats.refused, stats.displaced) == (1, 1)


@BOTH_LOOPS
async def test_a_burst_of_refused_requests_each_get_the_503() -> None:
    """1,000 POSTs at once past a full server: each client reads the 503 ``overloaded`` (closed
    at once, a refused connection whose request was already sent was reset, and the client saw
    a ``ReadError``), and no refused connection stays open after its client has the answer.
    The four requests filling it are held until the burst is answered: a fixed 1.5 s let 555
    of the burst in under uvloop (admitted once the four ended, not refused)."""
    limits = ConnectionLimits(header_timeout=2.0, max_connections=4, displace_after=5.0)
    async with guarded(limits) as (port, guard, app_seen):
        limit = httpx.Limits(max_connections=1100, max_keepalive_connections=0)
        # The four held requests wait for the whole burst: on a loaded 2-core machine 1,000
        # answers took past a 5 s client timeout (both loops failed so in one run), which is
        # not what this test reads; the whole burst stays bounded (fail_after below).
        async with httpx.AsyncClient(timeout=30, limits=limit) as client:
            seen: dict[object, int] = {}

            async def one(path: str, body: bytes | None) -> None:
                url = f"http://127.0.0.1:{port}{path}"
                try:
                    reply = await (client.get(url) if body is None else client.post(url, content=body))
                    key: object = reply.status_code
                except httpx.TransportError as exc:
                    key = type(exc).__name__
                seen[key] = seen.get(key, 0) + 1

            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(one, "/hold", None)
                with anyio.fail_after(5):
                    while guard.stats().running < 4:
                        await anyio.sleep(0.01)
                with anyio.fail_after(30):
                    async with anyio.create_task_group() as burst:
                        for _ in range(1000):
                            burst.start_soon(one, "/echo", b"x" * 300)
                app_seen.release.set()
        assert seen == {200: 4, 503: 1000}
        with anyio.fail_after(3):
            while guard.stats().lingering:
                await anyio.sleep(0.05)
        assert guard.stats().refused == 1000


def _big_header(size: int) -> bytes:
    return b"GET /ping HTTP/1.1\r\nHost: x\r\nX-big: " + b"a" * size + b"\r\n\r\n"


@pytest.mark.parametrize(
    ("what", "head", "chunk"),
    [
        # Sent 10 KB at a time: past 64 KiB before the head is complete (h11's bound).
        (
            "a 100 KB header line",
            b"GET /ping HTTP/1.1\r\nHost: x\r\nX-big: " + b"a" * 100_000 + b"\r\n\r\n",
            10_000,
        ),
        # Sent at once, still being written when the server answers.
        (
            "a 1 MB header line",
            b"GET /ping HTTP/1.1\r\nHost: x\r\nX-big: " + b"a" * 1_000_000 + b"\r\n\r\n",
            0,
        ),
        ("a head that is not HTTP", b"NOT HTTP AT ALL\r\n\r\n", 0),
    ],
)
async def test_a_head_h11_refuses_gets_our_json_400(what: str, head: bytes, chunk: int) -> None:
    """A request head h11 refuses gets 400 with the protocol's error body (``bad_request``),
    which the client can read whole. Was: uvicorn's plain text ("Invalid HTTP request
    received."), and for a 1 MB head the connection was reset under it."""
    async with guarded() as (port, guard, _), _connected(port) as (stream,):

        async def send() -> None:
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                for at in range(0, len(head), chunk or len(head)):
                    await stream.send(head[at : at + (chunk or len(head))])
                    await anyio.sleep(0.01 if chunk else 0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(send)
            reply = await _closed_within(stream, 3.0)
        status, _, rest = reply.partition(b"\r\n")
        assert status == b"HTTP/1.1 400 Bad Request", (what, reply[:200])
        headers, _, body = rest.partition(b"\r\n\r\n")
        assert b"content-type: application/json" in headers.lower(), (what, headers)
        error = json.loads(body)["error"]
        assert error["code"] == "bad_request"
        assert error["detail"] == (
            "the request head is not valid HTTP/1.1, or grew past 65,536 bytes before it was "
            "complete: send a well-formed head under that size"
        )
        with anyio.fail_after(3):
            while guard.stats().open or guard.stats().lingering:
                await anyio.sleep(0.05)
