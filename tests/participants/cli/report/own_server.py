"""A user's own FastAPI app served in process for the report's tests: a client of it inside its
lifespan (httpx's ASGI transport, the app's JSON-lines log written when the block ends), a restore
held by a slow middleware, a caller's ``traceparent`` and the figures a report line gives."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
from fastapi import FastAPI, Request
from starlette.middleware.base import RequestResponseEndpoint
from starlette.responses import Response

from ckpt_events.participants.fastapi import instrument, operation

#: A caller's trace context whose span is in no log given.
CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@contextlib.asynccontextmanager
async def client_of(
    app: FastAPI, *, base_url: str = "http://judge", raise_app_exceptions: bool = True
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``app`` in process, inside the app's lifespan (what uvicorn does at start and
    at stop): its sinks are closed, its log written, once the block ends."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
        async with httpx.AsyncClient(transport=transport, base_url=base_url) as client:
            yield client


def held_restore_app(
    log: Path, *, held: float, kind: str = "judge", downstream: FastAPI | None = None
) -> FastAPI:
    """A restore of c1 whose step ``read`` lasts ``ms`` (its body's) milliseconds, each request
    held ``held`` s by a middleware before its handler; with ``downstream``, the restore calls that
    app's restore (``ms`` 2) in its trace."""
    app = FastAPI()
    instrument(app, kind=kind, instance=f"{kind}-0", jsonl_path=str(log))

    @app.middleware("http")
    async def slow(request: Request, call_next: RequestResponseEndpoint) -> Response:
        await anyio.sleep(held)  # an auth check, a rate limiter: the request waits here
        return await call_next(request)

    @app.post("/checkpoint/restore")
    async def restore(request: Request) -> dict[str, int]:
        body = await request.json()
        with operation(request, "restore", checkpoint_id="c1") as op:
            with op.step("read"):
                await anyio.sleep(body["ms"] / 1000)
            if downstream is not None:
                transport = httpx.ASGITransport(app=downstream)
                async with httpx.AsyncClient(transport=transport, base_url="http://store") as client:
                    headers = {"traceparent": op.traceparent()}
                    reply = await client.post("/checkpoint/restore", json={"ms": 2}, headers=headers)
                    assert reply.status_code == 200
        return {"records": 0}

    return app


def figures(line: str) -> list[float]:
    """The ``N ms`` figures of a report's line, in order."""
    return [float(n) for n in re.findall(r"([\d.]+) ms", line)]
