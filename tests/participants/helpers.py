"""Shared helpers for the participant tests: a running app behind an ASGI client, bodies."""

from __future__ import annotations

import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
from fastapi import FastAPI

from ckpt_events.participants.protocol import CONTROL_PREFIX, EpisodeId
from ckpt_events.participants.workloads import ResourcesRecord

TOKEN = "test-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
#: The participants' checkpoint root in tests: every ``tmp_path`` lies under it.
ROOT = Path(tempfile.gettempdir())


@asynccontextmanager
async def running(app: FastAPI, *, raise_app_exceptions: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """Run ``app``'s lifespan and yield a client that talks to it in process (with the token);
    without ``raise_app_exceptions``, an exception leaving the app is its reply, as a server's."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=AUTH) as client:
            yield client


def resources_record(rollout_id: str, attempt: int = 0, boundary: int = 1) -> ResourcesRecord:
    """A resources episode's record at ``boundary``: one document line per boundary reached."""
    return ResourcesRecord(
        episode_id=EpisodeId(rollout_id, attempt),
        boundary=boundary,
        steps=3,
        session_id=f"res-{rollout_id}",
        counter=boundary,
        document=[f"line {i}" for i in range(1, boundary + 1)],
    )


def body(checkpoint_id: str = "c1", seconds: float = 5.0, **extra: Any) -> dict[str, Any]:
    return {"checkpoint_id": checkpoint_id, "deadline_ts": time.time() + seconds, **extra}


async def control(
    client: httpx.AsyncClient, op: str, checkpoint_id: str = "c1", *, headers: Any = None, **extra: Any
) -> httpx.Response:
    return await client.post(
        f"{CONTROL_PREFIX}/{op}",
        json=body(checkpoint_id, **extra),
        headers=AUTH if headers is None else headers,
    )


async def status(client: httpx.AsyncClient) -> dict[str, Any]:
    reply = await client.get(f"{CONTROL_PREFIX}/status", headers=AUTH)
    assert reply.status_code == 200, reply.text
    return reply.json()  # type: ignore[no-any-return]


async def retired_counts_during(
    client: httpx.AsyncClient, call: Callable[[], Awaitable[httpx.Response]]
) -> tuple[httpx.Response, list[int]]:
    """``call``'s reply, and the ``retired_count`` of each ``/status`` sent beside it (one a
    millisecond, at most 5,000): a call that gives the loop back as it goes is seen part way."""
    seen: list[int] = []
    replies: list[httpx.Response] = []
    done = anyio.Event()

    async def run() -> None:
        replies.append(await call())
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        for _ in range(5000):
            if done.is_set():
                break
            seen.append((await status(client))["retired_count"])
            await anyio.sleep(0.001)
    return replies[0], seen


def error_code(reply: httpx.Response) -> tuple[int, str]:
    return reply.status_code, reply.json()["error"]["code"]


async def wait_until(predicate: Callable[[], Any], timeout: float = 3.0, interval: float = 0.01) -> None:
    """Poll ``predicate`` (sync or async) until true; fail after ``timeout`` seconds."""
    with anyio.fail_after(timeout):
        while True:
            result = predicate()
            if hasattr(result, "__await__"):
                result = await result
            if result:
                return
            await anyio.sleep(interval)


async def run_episode(
    client: httpx.AsyncClient, rollout_id: str, attempt: int = 0, *, until: int | None = None
) -> int:
    """Advance an episode until ``until`` (or done); returns its boundary. Bounded by its steps."""
    view = (await client.get(f"/work/{_key(rollout_id, attempt)}")).json()
    target = view["steps"] if until is None else until
    boundary = view["boundary"]
    for _ in range(view["steps"] + 1):
        if boundary >= target:
            break
        reply = await client.post("/work/advance", json={"rollout_id": rollout_id, "attempt": attempt})
        assert reply.status_code == 200, reply.text
        boundary = reply.json()["boundary"]
    return boundary


def _key(rollout_id: str, attempt: int) -> str:
    return rollout_id if attempt == 0 else f"{rollout_id}-a{attempt}"


async def post_json(client: httpx.AsyncClient, path: str, payload: dict[str, Any]) -> httpx.Response:
    """``client.post(path, json=payload)``, in a form ``start_soon`` can call."""
    return await client.post(path, json=payload)


async def spoken_websocket(
    app: FastAPI, path: str, texts: int = 0, headers: list[tuple[bytes, bytes]] | None = None
) -> tuple[list[dict[str, Any]], int]:
    """``app``'s websocket route at ``path`` spoken to as uvicorn does (its lifespan run around
    it): a connect, ``texts`` text messages, then a disconnect once the route reads past them.
    What the app sent, and the wall clock (ns) just before the connect."""
    inbox: list[dict[str, Any]] = [
        {"type": "websocket.connect"},
        *({"type": "websocket.receive", "text": "grade"} for _ in range(texts)),
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return inbox.pop(0) if inbox else {"type": "websocket.disconnect", "code": 1000}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "websocket",
        "asgi": {"version": "3.0"},
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "scheme": "ws",
        "query_string": b"",
        "headers": [(b"host", b"judge"), *(headers or [])],
        "client": ("127.0.0.1", 1),
        "server": ("judge", 80),
        "subprotocols": [],
    }
    async with app.router.lifespan_context(app):
        before = time.time_ns()
        await app(scope, receive, send)
    return sent, before
