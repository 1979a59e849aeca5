"""The routes: bearer auth, the control and work routers, and the one place errors become bodies."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.to_thread
import httpx
from fastapi import FastAPI

from ckpt_events import Bus, Refused, Telemetry
from ckpt_events.participants.errors import WorkError
from ckpt_events.participants.protocol import CONTROL_PREFIX, SERVER_TIME_HEADER
from ckpt_events.participants.server.app import make_workload
from ckpt_events.participants.server.control import ControlPlane
from ckpt_events.participants.server.routes import (
    control_router,
    install_error_handlers,
    work_router,
)
from ckpt_events.participants.server.work import LocalWork
from ckpt_events.testing import MemorySink
from tests.participants.helpers import AUTH, TOKEN, body, error_code

_OPS = ("prepare", "renew", "commit", "restore", "resume", "retire", "forget")


def _app(tel: Telemetry | None, root: Path, *, start: bool = True) -> FastAPI:
    """The control and work routers on a resources workload, with the error handlers on ``tel``."""
    workload = make_workload("resources", tel or Telemetry(None, kind="resources", instance="res-0"))
    plane: ControlPlane[object] = ControlPlane(
        workload.tel, workload, lease_grace_seconds=60.0, checkpoint_root=root
    )
    app = FastAPI()
    install_error_handlers(app, tel)
    app.include_router(control_router(plane, TOKEN))
    app.include_router(work_router(LocalWork(workload), TOKEN, start=start))
    return app


@asynccontextmanager
async def _served(
    root: Path, *, start: bool = True
) -> AsyncIterator[tuple[httpx.AsyncClient, MemorySink, Bus, FastAPI]]:
    """A client (no token by default) of ``_app`` whose refusals land in a MemorySink."""
    async with Bus() as bus:
        sink = MemorySink()
        bus.subscribe(sink, name="memory")
        app = _app(Telemetry(bus, kind="resources", instance="res-0"), root, start=start)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client, sink, bus, app


async def _refused(bus: Bus, sink: MemorySink) -> list[tuple[str, str | None]]:
    await bus.flush()
    return [(e.code.value, e.checkpoint_id) for e in sink.of_type(Refused)]


async def test_a_missing_or_wrong_token_is_401_and_counted_without_a_checkpoint(tmp_path: Path) -> None:
    """No header, another scheme, a wrong token: 401 unauthorized on every route, the body's
    checkpoint id not trusted (each refusal is counted with none)."""
    async with _served(tmp_path) as (client, sink, bus, _):
        attempts = [
            client.post(f"{CONTROL_PREFIX}/prepare", json=body("c9")),
            client.get(f"{CONTROL_PREFIX}/status", headers={"authorization": f"Basic {TOKEN}"}),
            client.post("/work/start", json={"rollout_id": "r1"}, headers={"authorization": "Bearer nope"}),
            client.get("/work/r1", headers={"authorization": "Bearer"}),
        ]
        for attempt in attempts:
            reply = await attempt
            assert error_code(reply) == (401, "unauthorized")
            assert reply.json()["error"]["detail"] == "missing or wrong bearer token"
        assert await _refused(bus, sink) == [("unauthorized", None)] * 4


async def test_the_scheme_is_case_insensitive_and_the_token_trimmed(tmp_path: Path) -> None:
    """'BEARER' and spaces around the token are accepted; only the token's bytes must match."""
    async with _served(tmp_path) as (client, sink, bus, _):
        for value in (f"BEARER {TOKEN}", f"bearer  {TOKEN} "):
            reply = await client.get(f"{CONTROL_PREFIX}/status", headers={"authorization": value})
            assert reply.status_code == 200, value
        assert await _refused(bus, sink) == []


async def test_status_carries_the_server_clock(tmp_path: Path) -> None:
    """GET /status answers the plane's status with the server's time.time() in a header."""
    async with _served(tmp_path) as (client, *_):
        before = time.time()
        reply = await client.get(f"{CONTROL_PREFIX}/status", headers=AUTH)
        after = time.time()
    assert reply.status_code == 200 and reply.json()["phase"] == "idle"
    assert before <= float(reply.headers[SERVER_TIME_HEADER]) <= after


async def test_every_control_operation_is_mounted(tmp_path: Path) -> None:
    """Each of the seven operations is a POST route that decodes its body (422 on a bad one)."""
    async with _served(tmp_path) as (client, *_):
        client.headers.update(AUTH)
        for op in _OPS:
            reply = await client.post(f"{CONTROL_PREFIX}/{op}", content=b"[]")
            assert error_code(reply) == (422, "invalid_request"), op
            assert error_code(await client.get(f"{CONTROL_PREFIX}/{op}")) == (405, "method_not_allowed")
        assert error_code(await client.post(f"{CONTROL_PREFIX}/other", json={})) == (404, "not_found")


async def test_a_control_refusal_is_counted_with_its_checkpoint(tmp_path: Path) -> None:
    """A commit while idle is 409 invalid_phase, counted with the body's checkpoint id."""
    async with _served(tmp_path) as (client, sink, bus, _):
        reply = await client.post(
            f"{CONTROL_PREFIX}/commit", json=body("c7", checkpoint_dir="x"), headers=AUTH
        )
        assert error_code(reply) == (409, "invalid_phase")
        reply = await client.post(f"{CONTROL_PREFIX}/prepare", json=body("c8"), headers=AUTH)
        assert reply.status_code == 200 and reply.json()["phase"] == "prepared"
        assert await _refused(bus, sink) == [("invalid_phase", "c7")]


async def test_a_control_call_needs_no_worker_thread(tmp_path: Path) -> None:
    """A control route reads its caller's trace on the event loop: with every worker thread of
    the threadpool taken, a prepare still answers (``Depends(incoming)``, a plain ``def``, waited
    for a thread: each control call paid a thread hop)."""
    limiter = anyio.to_thread.current_default_thread_limiter()
    tokens = limiter.total_tokens
    limiter.total_tokens = 1
    try:
        async with _served(tmp_path) as (client, _, _, _), limiter:  # the one thread token, held
            with anyio.fail_after(5):
                reply = await client.post(f"{CONTROL_PREFIX}/prepare", json=body("c1"), headers=AUTH)
            assert reply.status_code == 200, reply.text
    finally:
        limiter.total_tokens = tokens


async def test_a_malformed_body_is_422_invalid_request_and_not_counted(tmp_path: Path) -> None:
    """Bad JSON or an unknown field is 422 invalid_request naming the problem; no refusal is counted."""
    async with _served(tmp_path) as (client, sink, bus, _):
        reply = await client.post(f"{CONTROL_PREFIX}/prepare", content=b"{", headers=AUTH)
        assert error_code(reply) == (422, "invalid_request")
        assert reply.json()["error"]["detail"].startswith("body is not valid JSON")
        reply = await client.post("/work/start", json={"rollout_id": "r1", "bogus": 1}, headers=AUTH)
        assert error_code(reply) == (422, "invalid_request") and "bogus" in reply.json()["error"]["detail"]
        assert await _refused(bus, sink) == []


async def test_the_work_routes_start_advance_and_view(tmp_path: Path) -> None:
    """start answers the capture key, advance the boundary, GET the episode's view."""
    async with _served(tmp_path) as (client, *_):
        client.headers.update(AUTH)
        reply = await client.post("/work/start", json={"rollout_id": "r1", "attempt": 1, "steps": 2})
        assert reply.json() == {"capture_key": "r1-a1", "boundary": 0}
        reply = await client.post("/work/advance", json={"rollout_id": "r1", "attempt": 1})
        assert reply.json() == {"boundary": 1, "done": False}
        view = (await client.get("/work/r1-a1")).json()
        assert (view["capture_key"], view["boundary"], view["steps"], view["kind"]) == (
            "r1-a1",
            1,
            2,
            "resources",
        )
        assert "worker" not in view


async def test_work_without_a_rollout_id_is_400_and_unknown_episodes_404(tmp_path: Path) -> None:
    """No rollout_id: 400 rollout_id_required (counted); an unknown episode: 404 naming its key."""
    async with _served(tmp_path) as (client, sink, bus, _):
        client.headers.update(AUTH)
        for path in ("/work/start", "/work/advance"):
            assert error_code(await client.post(path, json={})) == (400, "rollout_id_required")
        reply = await client.post("/work/advance", json={"rollout_id": "r9", "attempt": 2})
        assert reply.status_code == 404
        assert reply.json() == {"error": {"code": "not_found", "detail": "no episode r9-a2"}}
        reply = await client.get("/work/nobody")
        assert reply.json() == {"error": {"code": "not_found", "detail": "no episode nobody"}}
        assert await _refused(bus, sink) == [("rollout_id_required", None)] * 2


async def test_an_unknown_key_from_the_url_is_quoted_bounded_in_the_404(tmp_path: Path) -> None:
    """A key no capture key can be (60,000 characters; a control character) is quoted through
    ``shown`` in the 404's detail, not echoed whole (it was: a 60 KB detail for a 60 KB URL)."""
    async with _served(tmp_path) as (client, _, _, _):
        client.headers.update(AUTH)
        reply = await client.get("/work/" + "x" * 60_000)
        detail = reply.json()["error"]["detail"]
        assert error_code(reply) == (404, "not_found")
        assert len(detail) < 300 and "(60,000 characters)" in detail
        reply = await client.get("/work/r1%0Aforged")
        assert reply.json()["error"]["detail"] == "no episode 'r1\\nforged'"


async def test_a_workers_own_port_serves_no_start(tmp_path: Path) -> None:
    """With start=False there is no POST /work/start (405), and advance and view still answer."""
    async with _served(tmp_path, start=False) as (client, *_):
        client.headers.update(AUTH)
        assert error_code(await client.post("/work/start", json={"rollout_id": "r1"})) == (
            405,
            "method_not_allowed",
        )
        assert (await client.post("/work/advance", json={"rollout_id": "r1"})).status_code == 404


async def test_unknown_routes_and_methods_get_the_protocol_error_body(tmp_path: Path) -> None:
    """An unknown path is 404 not_found; a known path with the wrong method is 405 with Allow."""
    async with _served(tmp_path) as (client, *_):
        client.headers.update(AUTH)
        reply = await client.get("/nowhere")
        assert reply.json() == {"error": {"code": "not_found", "detail": "Not Found"}}
        reply = await client.delete(f"{CONTROL_PREFIX}/prepare")
        assert error_code(reply) == (405, "method_not_allowed") and reply.headers["allow"] == "POST"


async def test_a_work_error_is_502_upstream_error(tmp_path: Path) -> None:
    """A WorkError raised by a route is 502 upstream_error carrying its message; not counted."""
    async with _served(tmp_path) as (client, sink, bus, app):

        @app.get("/fails")
        async def fails() -> None:
            raise WorkError("the inference worker answered 500")

        reply = await client.get("/fails")
        assert reply.status_code == 502
        assert reply.json() == {
            "error": {"code": "upstream_error", "detail": "the inference worker answered 500"}
        }
        assert await _refused(bus, sink) == []


async def test_without_telemetry_refusals_are_answered_and_not_counted(tmp_path: Path) -> None:
    """install_error_handlers(app, None): a refusal still gets its status and body."""
    transport = httpx.ASGITransport(app=_app(None, tmp_path))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        reply = await client.post("/work/start", json={"rollout_id": "r1"})
    assert error_code(reply) == (401, "unauthorized")
