"""The request's arrival is the wait (``received_ns``) of the operations that began first in it
only: one begun after another operation of the request ended, or after the response started,
has none (unknown), rather than the server's own earlier work read as time queued."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest
from fastapi import BackgroundTasks, FastAPI, Request, WebSocket
from fastapi.responses import StreamingResponse

from ckpt_events import OperationFinished
from ckpt_events.participants.fastapi import incoming, instrument, operation, telemetry
from ckpt_events.testing import MemorySink
from tests.participants.helpers import spoken_websocket

#: What the first operation (or the handler before the response) spends: read as "queued" by
#: the operation after it, before the fix (a 300 ms first operation: "queued 301 ms").
WORK_S = 0.03


def _app(sink: MemorySink, *, base_http_middleware: bool) -> FastAPI:
    """An instrumented app whose routes open operations after earlier work of the same request."""
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", configure_sinks=lambda bus: bus.subscribe(sink))
    if base_http_middleware:  # a StreamingResponse's start reaches the server only as its body runs

        @app.middleware("http")
        async def passing(request: Request, call_next: Any) -> Any:
            return await call_next(request)

    @app.post("/two")
    async def two(request: Request) -> None:
        with operation(request, "prepare", checkpoint_id="first"):
            await anyio.sleep(WORK_S)
        with operation(request, "commit", checkpoint_id="second"):
            pass

    async def later(request: Request) -> None:
        with operation(request, "commit", checkpoint_id="background"):
            pass

    @app.post("/background")
    async def background(request: Request, tasks: BackgroundTasks) -> None:
        await anyio.sleep(WORK_S)
        tasks.add_task(later, request)

    @app.post("/stream")
    async def stream(request: Request) -> StreamingResponse:
        await anyio.sleep(WORK_S)

        async def body() -> AsyncIterator[bytes]:
            with operation(request, "commit", checkpoint_id="stream"):
                yield b"ok"

        return StreamingResponse(body())

    @app.post("/gather")
    async def gather(request: Request) -> None:
        async def one(cid: str, seconds: float) -> None:
            with operation(request, "commit", checkpoint_id=cid):
                await anyio.sleep(seconds)

        await asyncio.gather(one("gather-a", WORK_S), one("gather-b", 2 * WORK_S))

    @app.post("/after-incoming")
    async def after_incoming(request: Request) -> None:
        with incoming(request).operation(telemetry(request), "prepare", checkpoint_id="by-incoming"):
            await anyio.sleep(WORK_S)
        with operation(request, "commit", checkpoint_id="after-incoming"):
            pass

    @app.post("/incoming")
    async def late_incoming(request: Request) -> dict[str, bool]:
        early = incoming(request).received_ns is not None
        with operation(request, "prepare", checkpoint_id="incoming"):
            pass
        return {
            "early": early,
            "late": incoming(request).received_ns is not None,
            "shown": repr(incoming(request)).startswith("Incoming(parent=None, "),
        }

    return app


async def _served(app: FastAPI, path: str) -> httpx.Response:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            reply = await client.post(path)
    assert reply.status_code == 200
    return reply


@pytest.mark.parametrize("base_http_middleware", [False, True])
@pytest.mark.parametrize(
    ("path", "waited"),
    [
        ("/two", {"first": True, "second": False}),  # was: second "queued 31 ms"
        ("/background", {"background": False}),  # was: the handler's 30 ms
        ("/stream", {"stream": False}),  # was: the handler's 30 ms
        ("/gather", {"gather-a": True, "gather-b": True}),  # both began before either ended
        ("/incoming", {"incoming": True}),
        # was: after-incoming "queued 31 ms", the first operation's time
        ("/after-incoming", {"by-incoming": True, "after-incoming": False}),
    ],
)
async def test_only_operations_begun_before_any_ended_wait_from_the_arrival(
    path: str, waited: dict[str, bool], base_http_middleware: bool
) -> None:
    """An operation begun after another of its request ended (one of ``operation(request)`` or
    of ``incoming(request).operation(...)``), or after the response started (``BackgroundTasks``,
    a ``StreamingResponse``'s body, with or without ``BaseHTTPMiddleware``),
    has no ``received_ns``; concurrent ones begun first all have the arrival."""
    sink = MemorySink()
    before = time.time_ns()
    await _served(_app(sink, base_http_middleware=base_http_middleware), path)
    finished = {e.checkpoint_id: e for e in sink.of_type(OperationFinished)}
    assert {cid: e.received_ns is not None for cid, e in finished.items()} == waited
    arrivals = {e.received_ns for e in finished.values() if e.received_ns is not None}
    assert len(arrivals) <= 1  # one request, one arrival
    for e in finished.values():
        if e.received_ns is not None:
            assert before <= e.received_ns <= e.start_ns


async def test_incoming_has_no_arrival_once_the_wait_is_over() -> None:
    """``incoming(request)`` taken after an operation of the request ended has no ``received_ns``,
    as an operation begun then has none."""
    reply = await _served(_app(MemorySink(), base_http_middleware=False), "/incoming")
    # Shown as what incoming() is documented to give (its subclass that ends the wait is ours).
    assert reply.json() == {"early": True, "late": False, "shown": True}


async def test_a_websocket_s_connect_is_the_wait_of_its_first_operation_only() -> None:
    """Three messages, an operation each: the connect time is the first one's wait; the others
    (begun after it ended) have none, where they read 34 ms and 65 ms "queued"."""
    sink = MemorySink()
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", configure_sinks=lambda bus: bus.subscribe(sink))

    @app.websocket("/grade")
    async def grade(websocket: WebSocket) -> None:
        await websocket.accept()
        for n in range(3):
            await websocket.receive_text()
            with operation(websocket, "commit", checkpoint_id=f"ws-{n}"):
                await anyio.sleep(WORK_S)
            await websocket.send_text("ok")
        await websocket.close()

    sent, before = await spoken_websocket(app, "/grade", texts=3)
    assert [m["type"] for m in sent] == ["websocket.accept", *["websocket.send"] * 3, "websocket.close"]
    first, *rest = sorted(sink.of_type(OperationFinished), key=lambda e: e.start_ns)
    assert first.checkpoint_id == "ws-0"
    assert first.received_ns is not None and before <= first.received_ns <= first.start_ns
    assert [(e.checkpoint_id, e.received_ns) for e in rest] == [("ws-1", None), ("ws-2", None)]
