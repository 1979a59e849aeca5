"""build_app and build_work_app: what every participant app is given, and its lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from anyio.abc import TaskGroup
from fastapi import FastAPI

from ckpt_events import Bus, LeaseExpired, Refused, Telemetry
from ckpt_events.participants.protocol import CONTROL_PREFIX, EpisodeId
from ckpt_events.participants.server.app import make_workload
from ckpt_events.participants.server.builder import build_app, build_work_app
from ckpt_events.participants.server.control import ControlPlane
from ckpt_events.participants.server.routes import work_router
from ckpt_events.participants.server.work import LocalWork
from ckpt_events.participants.workloads import ResourcesWorkload
from ckpt_events.participants.workloads.base import Workload
from ckpt_events.testing import MemorySink
from tests.participants.helpers import AUTH, TOKEN, body, error_code, running, wait_until


def _parts(tel: Telemetry, root: Path, grace: float = 60.0) -> tuple[Workload[Any, Any], ControlPlane[Any]]:
    workload = make_workload("resources", tel, request_seconds=0)
    return workload, ControlPlane(tel, workload, lease_grace_seconds=grace, checkpoint_root=root)


def _build(tel: Telemetry, workload: Workload[Any, Any], plane: ControlPlane[Any], **options: Any) -> FastAPI:
    """``build_app`` over these parts, on ``tel``'s bus (not owned unless ``own_bus=True``)."""
    return build_app(
        title=options.pop("title", "test participant"),
        tel=tel,
        plane=plane,
        work=workload,
        work_router=work_router(LocalWork(workload), TOKEN),
        token=TOKEN,
        max_body_bytes=options.pop("max_body_bytes", 1024),
        bus=tel.bus,
        own_bus=options.pop("own_bus", False),
        **options,
    )


def _app(bus: Bus, root: Path, **options: Any) -> FastAPI:
    """A participant app on ``bus`` (not owned) built from a resources workload."""
    tel = Telemetry(bus, kind="resources", instance="res-0")
    workload, plane = _parts(tel, root, options.pop("grace", 60.0))
    return _build(tel, workload, plane, **options)


async def test_the_app_state_holds_what_a_caller_may_read(tmp_path: Path) -> None:
    """bus, telemetry, workload, control, monitor and the extra state are on app.state."""
    async with Bus() as bus:
        app = _app(bus, tmp_path, state={"pool": "the pool", "extra": 3})
        assert app.state.bus is bus and app.state.telemetry.bus is bus
        assert app.state.control.workload is app.state.workload
        assert app.state.monitor is not None
        assert (app.state.pool, app.state.extra) == ("the pool", 3)
        assert app.title == "test participant"
        assert (app.docs_url, app.redoc_url, app.openapi_url) == (None, None, None)


async def test_the_app_serves_control_and_work_with_the_error_handlers(tmp_path: Path) -> None:
    """Both routers answer behind the token; a refusal is counted on the app's telemetry."""
    async with Bus() as bus:
        sink = MemorySink()
        bus.subscribe(sink, name="memory")
        app = _app(bus, tmp_path)
        async with running(app) as client:
            assert (
                await client.post("/work/start", json={"rollout_id": "r1", "steps": 1})
            ).status_code == 200
            reply = await client.post(f"{CONTROL_PREFIX}/prepare", json=body("c1"))
            assert reply.json()["phase"] == "prepared"
            reply = await client.get(f"{CONTROL_PREFIX}/status", headers={"authorization": ""})
            assert error_code(reply) == (401, "unauthorized")
            assert error_code(await client.get("/docs", headers=AUTH)) == (404, "not_found")
        await bus.flush()
        assert [e.code.value for e in sink.of_type(Refused)] == ["unauthorized"]


async def test_the_body_limit_is_installed(tmp_path: Path) -> None:
    """A body over max_body_bytes is 413 payload_too_large naming the app's bound."""
    async with Bus() as bus:
        async with running(_app(bus, tmp_path, max_body_bytes=64)) as client:
            reply = await client.post("/work/start", content=b"x" * 65)
    assert error_code(reply) == (413, "payload_too_large")
    assert reply.json()["error"]["detail"] == "request body over the 64-byte bound"


class _ClosingWorkload(ResourcesWorkload):
    """A user's workload whose aclose() is recorded, in order with the lifespan body's steps."""

    def __init__(self, tel: Telemetry, events: list[str]) -> None:
        super().__init__(tel, request_seconds=0)
        self.events = events

    async def aclose(self) -> None:
        self.events.append("aclose")


async def test_the_lifespan_runs_the_body_around_serving_and_closes_the_work_last(tmp_path: Path) -> None:
    """The lifespan body is entered before the first request and left at shutdown; the work is
    closed after it, exactly once."""
    events: list[str] = []

    @asynccontextmanager
    async def lifespan_body(app: FastAPI, tg: TaskGroup) -> AsyncIterator[None]:
        events.append("enter")
        yield
        events.append("exit")

    async with Bus() as bus:
        tel = Telemetry(bus, kind="resources", instance="res-0")
        workload = _ClosingWorkload(tel, events)
        plane: ControlPlane[Any] = ControlPlane(
            tel, workload, lease_grace_seconds=60.0, checkpoint_root=tmp_path
        )
        app = _build(tel, workload, plane, title="closing", body=lifespan_body)
        async with running(app) as http:
            assert events == ["enter"]
            assert (await http.get(f"{CONTROL_PREFIX}/status")).status_code == 200
        assert events == ["enter", "exit", "aclose"]


async def test_the_lifespan_watches_the_lease_without_any_call(tmp_path: Path) -> None:
    """A prepared lease that runs out resumes the plane by itself (lease_expired is counted)."""
    async with Bus() as bus:
        sink = MemorySink()
        bus.subscribe(sink, name="memory")
        app = _app(bus, tmp_path, grace=0.05)
        async with running(app) as client:
            reply = await client.post(f"{CONTROL_PREFIX}/prepare", json=body("c1", seconds=0.2))
            assert reply.json()["phase"] == "prepared"

            async def expired() -> bool:
                await bus.flush()
                return bool(sink.of_type(LeaseExpired))

            await wait_until(expired, timeout=3.0)
            assert app.state.control.phase.value == "idle"
        assert [(e.phase.value, e.checkpoint_id) for e in sink.of_type(LeaseExpired)] == [("prepared", "c1")]


async def test_an_owned_bus_is_entered_and_its_sinks_configured_and_closed(tmp_path: Path) -> None:
    """own_bus: the lifespan enters the bus, calls configure_sinks(bus), awaits its handle's aclose."""
    bus = Bus()
    sink = MemorySink()
    closed: list[bool] = []

    class Handle:
        async def aclose(self) -> None:
            closed.append(True)

    def configure(got: Bus) -> Handle:
        assert got is bus
        got.subscribe(sink, name="memory")
        return Handle()

    tel = Telemetry(bus, kind="resources", instance="res-0")
    workload, plane = _parts(tel, tmp_path)
    app = _build(tel, workload, plane, title="owned", own_bus=True, configure_sinks=configure)
    async with running(app) as client:
        assert error_code(await client.post("/work/start", json={})) == (400, "rollout_id_required")
        await bus.flush()
        assert [e.code.value for e in sink.of_type(Refused)] == ["rollout_id_required"]
    assert closed == [True] and sink.closed


async def test_the_work_app_serves_the_work_routes_alone(tmp_path: Path) -> None:
    """build_work_app: work routes behind the token, no control plane, the body limit, no docs."""
    async with Bus() as bus:
        sink = MemorySink()
        bus.subscribe(sink, name="memory")
        tel = Telemetry(bus, kind="resources", instance="res-0", worker=1)
        workload = make_workload("resources", tel, request_seconds=0)
        workload_id = EpisodeId("r1")
        workload.start(workload_id, 2)
        app = build_work_app(
            title="worker 1",
            tel=tel,
            work_router=work_router(LocalWork(workload, worker=1), TOKEN, start=False),
            max_body_bytes=64,
        )
        assert app.state.telemetry is tel and app.state.monitor is not None
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", headers=AUTH) as client:
            view = (await client.get(f"/work/{workload_id.capture_key}")).json()
            assert (view["capture_key"], view["worker"]) == ("r1", 1)
            assert error_code(await client.get(f"{CONTROL_PREFIX}/status")) == (404, "not_found")
            assert error_code(await client.post("/work/advance", content=b"x" * 65)) == (
                413,
                "payload_too_large",
            )
            reply = await client.post(
                "/work/advance", json={"rollout_id": "r1"}, headers={"authorization": ""}
            )
            assert error_code(reply) == (401, "unauthorized")
        await bus.flush()
        assert [(e.code.value, e.worker) for e in sink.of_type(Refused)] == [("unauthorized", 1)]
