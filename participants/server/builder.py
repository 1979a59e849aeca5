"""``build_app``: the one place a participant's FastAPI app is put together.

Both the single-process app (``create_app``) and the multi-worker main process
(``create_worker_app``) come from here, so neither can drop a part the other has: the state
names, the error handlers, the control and work routers, the body limit, the arrival stamp
(outermost, so ``received_ns`` is taken before routing, body parsing and auth), and a
lifespan that owns the bus when asked, runs the loop-lag monitor and the lease watcher, and
closes the workload (or the worker pool) last.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup
from fastapi import APIRouter, FastAPI

from ckpt_events import Bus, Telemetry
from ckpt_events.participants.server.arrival import ArrivalMiddleware, LoopLagMonitor
from ckpt_events.participants.server.control import ControlPlane
from ckpt_events.participants.server.limits import BodyLimit
from ckpt_events.participants.server.routes import control_router, install_error_handlers

__all__ = ["Closeable", "LifespanBody", "build_app", "build_work_app"]


class Closeable(Protocol):
    """What the app serves work from: a workload, or the pool of workers standing for one."""

    async def aclose(self) -> None: ...


#: Runs inside the lifespan's task group, around the app's serving time: enter = start what
#: the app needs before the lease watcher and the first request, exit = stop it (before the
#: task group is cancelled).
LifespanBody = Callable[[FastAPI, TaskGroup], AbstractAsyncContextManager[None]]


@asynccontextmanager
async def _nothing(app: FastAPI, tg: TaskGroup) -> AsyncIterator[None]:
    yield


def build_app(
    *,
    title: str,
    tel: Telemetry,
    plane: ControlPlane[Any],
    work: Closeable,
    work_router: APIRouter,
    token: str,
    max_body_bytes: int,
    bus: Bus,
    own_bus: bool,
    configure_sinks: Callable[[Bus], Any] | None = None,
    body: LifespanBody = _nothing,
    state: Mapping[str, Any] | None = None,
) -> FastAPI:
    """A participant app serving ``plane`` and ``work_router``, with ``work`` closed at shutdown.

    ``app.state`` holds ``bus``, ``telemetry`` (``tel``, which also reports the error
    handlers' refusals), ``workload`` (``work``),
    ``control`` (``plane``), ``monitor`` (the ``LoopLagMonitor``) and whatever ``state`` adds.
    With ``own_bus`` the lifespan enters ``bus``, calls ``configure_sinks(bus)`` (awaiting it
    if it returns an awaitable) and at shutdown awaits its result's ``aclose()``, if any.
    """
    monitor = LoopLagMonitor()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            if own_bus:
                await stack.enter_async_context(bus)
                if configure_sinks is not None:
                    handle = configure_sinks(bus)
                    if inspect.isawaitable(handle):
                        handle = await handle
                    if handle is not None and hasattr(handle, "aclose"):
                        stack.push_async_callback(handle.aclose)
            stack.push_async_callback(work.aclose)
            async with anyio.create_task_group() as tg:
                tg.start_soon(monitor.run)
                async with body(app, tg):
                    tg.start_soon(plane.watch_lease)
                    yield
                tg.cancel_scope.cancel()

    app = FastAPI(title=title, lifespan=lifespan)
    app.state.bus = bus
    app.state.telemetry = tel
    app.state.workload = work
    app.state.control = plane
    app.state.monitor = monitor
    for name, value in (state or {}).items():
        setattr(app.state, name, value)
    install_error_handlers(app, tel)
    app.include_router(control_router(plane, token))
    app.include_router(work_router)
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    # Outermost of ours: the arrival stamp is taken before routing, body parsing and auth.
    app.add_middleware(ArrivalMiddleware, monitor=monitor)
    return app


def build_work_app(
    *, title: str, tel: Telemetry, work_router: APIRouter, max_body_bytes: int, monitor: LoopLagMonitor
) -> FastAPI:
    """The work routes alone, as a worker of a multi-worker server serves them on its own
    port: the same error handlers, body limit and arrival stamp as ``build_app``; the worker
    runs ``monitor`` and owns its workload's lifetime, so there is no lifespan here."""
    app = FastAPI(title=title)
    app.state.telemetry = tel
    app.state.monitor = monitor
    install_error_handlers(app, tel)
    app.include_router(work_router)
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    app.add_middleware(ArrivalMiddleware, monitor=monitor)
    return app
