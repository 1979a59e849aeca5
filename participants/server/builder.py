"""``build_app``: the one place a participant's FastAPI app is put together.

Both the single-process app (``create_app``) and the multi-worker main process
(``create_worker_app``) come from here, so neither can drop a part the other has: the state
names, the error handlers, the control and work routers, the body limit, no docs routes, and a
lifespan that runs the lease watcher and closes the workload (or the worker pool) last.
Telemetry is wired as any user's app is, by ``ckpt_events.participants.fastapi.instrument``:
the bus (owned when asked) around that lifespan, the arrival stamp (outermost, so
``received_ns`` is taken before routing, body parsing and auth) and the loop-lag monitor.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any, Final, Protocol

import anyio
from anyio.abc import TaskGroup
from fastapi import APIRouter, FastAPI

from ckpt_events import Bus, Telemetry
from ckpt_events.participants.fastapi import instrument
from ckpt_events.participants.server.control import ControlPlane
from ckpt_events.participants.server.limits import BodyLimit, StopCutAnswered
from ckpt_events.participants.server.routes import control_router, install_error_handlers

__all__ = ["Closeable", "LifespanBody", "build_app", "build_work_app"]

# No /docs, /redoc or /openapi.json: they would describe the API to anyone without the token
# (a browser cannot send it to them), and no client of a participant reads them. The schema
# is still built in process by ``app.openapi()``.
_NO_DOCS: Final[dict[str, Any]] = {"docs_url": None, "redoc_url": None, "openapi_url": None}


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
    if it returns an awaitable) and at shutdown awaits its result's ``aclose()``, if any
    (``instrument(app, telemetry=tel)``, around the participant's own lifespan).
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            # Last out: what a restore froze is collectable once the app has ended (the
            # whole app stayed in memory, 60 of 60 after 60 restores in one process).
            stack.callback(plane.thaw)
            stack.push_async_callback(work.aclose)
            async with anyio.create_task_group() as tg:
                async with body(app, tg):
                    tg.start_soon(plane.watch_lease)
                    yield
                tg.cancel_scope.cancel()

    app = FastAPI(title=title, lifespan=lifespan, **_NO_DOCS)
    app.state.bus = bus
    app.state.telemetry = tel
    app.state.workload = work
    app.state.control = plane
    for name, value in (state or {}).items():
        setattr(app.state, name, value)
    install_error_handlers(app, tel)
    app.include_router(control_router(plane, token))
    app.include_router(work_router)
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    app.add_middleware(StopCutAnswered)
    # Last, so its arrival stamp is outermost: taken before routing, body parsing and auth.
    if own_bus:
        instrumented = instrument(app, telemetry=tel, configure_sinks=configure_sinks or _no_sinks)
    else:
        instrumented = instrument(app, telemetry=tel, bus=bus)
    app.state.monitor = instrumented.monitor
    return app


def _no_sinks(bus: Bus) -> None:
    """A participant without ``configure_sinks`` subscribes nothing (the caller may, later)."""


def build_work_app(*, title: str, tel: Telemetry, work_router: APIRouter, max_body_bytes: int) -> FastAPI:
    """The work routes alone, as a worker of a multi-worker server serves them on its own
    port: the same error handlers, body limit and arrival stamp as ``build_app``; the worker
    owns its bus and its workload's lifetime, so it serves this app without its lifespan and
    runs its loop-lag monitor (``app.state.monitor``) itself."""
    app = FastAPI(title=title, **_NO_DOCS)
    app.state.telemetry = tel
    install_error_handlers(app, tel)
    app.include_router(work_router)
    app.add_middleware(BodyLimit, max_body_bytes=max_body_bytes)
    app.add_middleware(StopCutAnswered)
    app.state.monitor = instrument(app, telemetry=tel, bus=tel.bus).monitor
    return app
