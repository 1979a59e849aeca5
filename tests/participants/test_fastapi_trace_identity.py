"""Every span of a busy instrumented app is in its own request's trace, under its own parent,
with its own checkpoint id, wherever the work ran: the handler's task, a task it made, a
worker thread, a sync endpoint, ``BackgroundTasks``, a ``StreamingResponse``'s generator
(async and sync), a ``yield`` dependency's teardown (async and sync), an exception handler,
and middleware added before and after ``instrument()``; their steps interleaving."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

import anyio
import anyio.to_thread
import httpx
import pytest
from fastapi import BackgroundTasks, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ckpt_events import OperationFinished, OperationSpan, StepFinished
from ckpt_events.participants.fastapi import incoming, instrument, operation, telemetry
from ckpt_events.testing import MemorySink

ROUTES = ("plain", "task", "thread", "sync", "background", "stream", "sync-stream", "dependency", "handler")
REQUESTS = 300


async def _steps(op: OperationSpan, n: int = 2) -> None:
    for k in range(n):
        with op.step(f"s{k}"):
            await asyncio.sleep(0)  # every request's steps interleave with the others'


async def _teardown(request: Request) -> AsyncIterator[None]:
    yield
    with operation(request, "retire", checkpoint_id=request.path_params["cid"]) as op:
        await _steps(op, 1)


def _sync_teardown(request: Request) -> Iterator[None]:  # FastAPI runs it in its threadpool
    yield
    with operation(request, "retire", checkpoint_id=request.path_params["cid"]) as op, op.step("t"):
        pass


def _cid(request: Request) -> str:
    """The checkpoint id: the path's last segment (the middlewares run before routing)."""
    return request.url.path.rsplit("/", 1)[1]


def _app(sink: MemorySink, otel_context: bool) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def before(request: Request, call_next: Any) -> Any:  # added before instrument()
        with operation(request, "prepare", checkpoint_id=f"before-{_cid(request)}"):
            await asyncio.sleep(0)
            return await call_next(request)

    instrument(
        app,
        kind="judge",
        instance="judge-0",
        configure_sinks=lambda bus: bus.subscribe(sink),
        otel_context=otel_context,
    )

    @app.middleware("http")
    async def after(request: Request, call_next: Any) -> Any:  # added after instrument()
        reply = await call_next(request)
        with operation(request, "resume", checkpoint_id=f"after-{_cid(request)}"):
            await asyncio.sleep(0)
        return reply

    class Boom(Exception):
        pass

    @app.exception_handler(Boom)
    async def on_boom(request: Request, exc: Boom) -> JSONResponse:
        with operation(request, "forget", checkpoint_id=request.path_params["cid"]) as op:
            await _steps(op, 1)
        return JSONResponse({}, status_code=418)

    @app.post("/plain/{cid}")
    async def plain(request: Request, cid: str) -> None:
        with operation(request, "commit", checkpoint_id=cid) as op:
            await _steps(op)

    @app.post("/task/{cid}")
    async def task(request: Request, cid: str) -> None:
        async def work() -> None:
            with incoming(request).operation(telemetry(request), "commit", checkpoint_id=cid) as op:
                await _steps(op)

        await asyncio.create_task(work())

    @app.post("/thread/{cid}")
    async def thread(request: Request, cid: str) -> None:
        def work() -> None:
            with operation(request, "commit", checkpoint_id=cid) as op, op.step("t"):
                pass

        await anyio.to_thread.run_sync(work)

    @app.post("/sync/{cid}")
    def sync(request: Request, cid: str) -> None:
        with operation(request, "commit", checkpoint_id=cid) as op, op.step("t"):
            pass

    @app.post("/background/{cid}")
    async def background(request: Request, cid: str, tasks: BackgroundTasks) -> None:
        async def later() -> None:  # runs after the response went
            with operation(request, "commit", checkpoint_id=cid) as op:
                await _steps(op)

        tasks.add_task(later)

    @app.post("/stream/{cid}")
    async def stream(request: Request, cid: str) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            with operation(request, "commit", checkpoint_id=cid) as op:
                for k in range(2):
                    with op.step(f"s{k}"):
                        await asyncio.sleep(0)
                        yield b"x"

        return StreamingResponse(chunks())

    @app.post("/sync-stream/{cid}")
    async def sync_stream(request: Request, cid: str) -> StreamingResponse:
        def chunks() -> Iterator[bytes]:  # each chunk in a worker thread
            with operation(request, "commit", checkpoint_id=cid) as op:
                for k in range(2):
                    with op.step(f"s{k}"):
                        yield b"x"

        return StreamingResponse(chunks())

    @app.post("/dependency/{cid}")
    async def dependency(
        request: Request,
        cid: str,
        _a: Annotated[None, Depends(_teardown)],
        _s: Annotated[None, Depends(_sync_teardown)],
    ) -> None:
        with operation(request, "commit", checkpoint_id=cid) as op:
            await _steps(op, 1)

    @app.post("/handler/{cid}")
    async def handler(request: Request, cid: str) -> None:
        with operation(request, "commit", checkpoint_id=cid) as op:
            await _steps(op, 1)
        raise Boom

    return app


@pytest.mark.parametrize("otel_context", [False, True])
async def test_every_span_of_300_interleaved_requests_is_in_its_own_trace(otel_context: bool) -> None:
    """300 concurrent requests, 9 ways of running the work, each request with its own
    ``traceparent`` and checkpoint id: no span in another request's trace or a fresh root,
    every operation the caller's child (or, with ``otel_context``, the child of the request's
    operation it ran inside), every step its own operation's child."""
    sink = MemorySink()
    app = _app(sink, otel_context)
    sent: dict[str, tuple[int, int]] = {}
    rng = random.Random(7)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://judge") as client:

            async def one(i: int) -> int:
                cid = f"{ROUTES[i % len(ROUTES)]}.{i}"
                trace, span = rng.getrandbits(128) | 1, rng.getrandbits(64) | 1
                sent[cid] = (trace, span)
                headers = {"traceparent": f"00-{trace:032x}-{span:016x}-01"}
                reply = await client.post(f"/{cid.split('.', maxsplit=1)[0]}/{cid}", headers=headers)
                return reply.status_code

            codes = await asyncio.gather(*(one(i) for i in range(REQUESTS)))
    assert sorted(set(codes)) == [200, 418]
    operations = {e.span_id: e for e in sink.of_type(OperationFinished)}
    steps = sink.of_type(StepFinished)
    # Each request's 2 middleware operations and its own operations and steps: none lost.
    assert len(operations) + len(steps) == 1_565
    wrong = []
    for event in [*operations.values(), *steps]:
        cid = event.checkpoint_id or ""
        trace, caller = sent[cid.removeprefix("before-").removeprefix("after-")]
        if event.trace_id != trace:
            wrong.append((cid, "trace"))
        elif isinstance(event, StepFinished):
            parent = operations.get(event.parent_span_id or 0)
            if parent is None or parent.checkpoint_id != cid:
                wrong.append((cid, "step parent"))
        elif event.parent_span_id != caller:
            parent = operations.get(event.parent_span_id or 0)
            if not otel_context or parent is None or parent.trace_id != trace:
                wrong.append((cid, "operation parent"))
        if event.outcome != "ok":
            wrong.append((cid, event.outcome))
    assert wrong == []
