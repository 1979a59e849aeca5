"""``ckpt_events.participants.fastapi``: a user's own FastAPI app, instrumented in one call."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import anyio
import anyio.to_thread
import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, WebSocket
from fastapi.responses import JSONResponse, StreamingResponse

from ckpt_events import (
    Bus,
    ConfigurationError,
    InvalidTypeError,
    OperationFinished,
    OperationStarted,
    Refused,
    StepFinished,
    Telemetry,
    parse_traceparent,
)
from ckpt_events.participants import fastapi as fastapi_module
from ckpt_events.participants.fastapi import (
    Incoming,
    incoming,
    incoming_dependency,
    instrument,
    operation,
    telemetry,
)
from ckpt_events.participants.fastapi.lifespan import _CLOSE_GRACE_S as CLOSE_GRACE_S
from ckpt_events.sinks import read_events
from ckpt_events.testing import CLOCK_START_NS, EventCapture, MemorySink
from tests.loop_gaps import ticking
from tests.participants.asgi_servers import asgi_server
from tests.participants.helpers import spoken_websocket
from tests.sinks.test_hostile_collector import Hostile

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PARENT_ID = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{PARENT_ID:016x}-01"


def _user_app(sink: MemorySink, lifespan: Any = None, **options: Any) -> FastAPI:
    """A user's app: one route running one operation, instrumented with ``sink`` as its sink."""
    app = FastAPI(lifespan=lifespan)
    instrument(
        app, kind="judge", instance="judge-0", configure_sinks=lambda bus: bus.subscribe(sink), **options
    )

    @app.post("/grade/{checkpoint_id}")
    async def grade(request: Request, checkpoint_id: str) -> dict[str, Any]:
        with operation(request, "commit", checkpoint_id=checkpoint_id, grader="exact") as op:
            with op.step("write"):
                await anyio.sleep(0)
            op.set(records=3)
            return {"traceparent": op.traceparent(), "tracestate": op.tracestate()}

    return app


@asynccontextmanager
async def _serving(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


async def test_an_app_s_own_lifespan_runs_inside_ours() -> None:
    """The app's startup sees the bus running and its sinks subscribed; its shutdown's events
    are still delivered: ours starts first and drains last."""
    sink = MemorySink()
    seen: list[str] = []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, str]]:
        tel = telemetry(app)
        seen.append(f"their startup, enabled={tel.enabled}")
        with tel.operation("restore", checkpoint_id="at-startup"):
            pass
        yield {"greeting": "hello"}
        with tel.operation("retire", checkpoint_id="at-shutdown"):
            pass
        seen.append("their shutdown")

    app = _user_app(sink, lifespan)
    async with app.router.lifespan_context(app) as state:
        assert state == {"greeting": "hello"}  # their lifespan state passes through
    assert seen == ["their startup, enabled=True", "their shutdown"]
    assert [e.checkpoint_id for e in sink.of_type(OperationFinished)] == ["at-startup", "at-shutdown"]
    assert sink.closed


# Starlette before 0.37 (fastapi 0.110's) warns at the user's own FastAPI(on_startup=...), not at ours.
@pytest.mark.filterwarnings("ignore:The on_startup and on_shutdown parameters are deprecated")
async def test_on_startup_handlers_run_too() -> None:
    """An app with ``on_startup``/``on_shutdown`` handlers (no lifespan=) keeps them."""
    sink = MemorySink()
    calls: list[str] = []
    app = FastAPI(on_startup=[lambda: calls.append("up")], on_shutdown=[lambda: calls.append("down")])
    instrument(app, kind="judge", instance="judge-0", configure_sinks=lambda bus: bus.subscribe(sink))
    async with _serving(app):
        assert calls == ["up"]
    assert calls == ["up", "down"]


async def test_an_operation_continues_the_caller_s_trace_from_its_arrival() -> None:
    """traceparent gives the trace and remote parent, tracestate is kept, received_ns <= start_ns."""
    sink = MemorySink()
    app = _user_app(sink)
    async with _serving(app) as client:
        before = time.time_ns()
        headers = [("traceparent", TRACEPARENT), ("tracestate", "rojo=1"), ("tracestate", "congo=2")]
        reply = await client.post("/grade/c1", headers=headers)
    assert reply.status_code == 200, reply.text
    (started,) = sink.of_type(OperationStarted)
    (finished,) = sink.of_type(OperationFinished)
    assert (finished.kind, finished.instance, finished.operation) == ("judge", "judge-0", "commit")
    assert (finished.trace_id, finished.parent_span_id, finished.parent_remote) == (TRACE_ID, PARENT_ID, True)
    assert finished.checkpoint_id == "c1" and finished.records == 3
    assert finished.attributes == {"grader": "exact"}
    assert finished.received_ns is not None and before <= finished.received_ns <= started.start_ns
    assert finished.loop_lag_ms is not None and finished.loop_lag_ms >= 0.0
    (step,) = sink.of_type(StepFinished)
    assert step.parent_span_id == finished.span_id
    outgoing = parse_traceparent(reply.json()["traceparent"])
    assert outgoing is not None and (outgoing.trace_id, outgoing.span_id) == (TRACE_ID, finished.span_id)
    assert reply.json()["tracestate"] == "rojo=1,congo=2"


async def test_with_telemetry_off_an_operation_hands_the_caller_s_trace_and_tracestate_on() -> None:
    """An app with no sink hands on the caller's ``traceparent`` and the ``tracestate`` that came
    with it (was: the traceparent alone, the tracestate dropped before the handle could keep it)."""
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", configure_sinks=lambda bus: None)

    @app.get("/")
    async def root(request: Request) -> dict[str, Any]:
        with operation(request, "commit", checkpoint_id="c1") as op, op.step("write") as step:
            return {
                "op": [op.traceparent(), op.tracestate()],
                "step": [step.traceparent(), step.tracestate()],
            }

    async with _serving(app) as client:
        assert not telemetry(app).enabled
        reply = await client.get("/", headers=[("traceparent", TRACEPARENT), ("tracestate", "rojo=1")])
    assert reply.json() == {"op": [TRACEPARENT, "rojo=1"], "step": [TRACEPARENT, "rojo=1"]}


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [("traceparent", "00-not-a-trace-01"), ("tracestate", "rojo=1")],
        [("traceparent", f"00-{0:032x}-{PARENT_ID:016x}-01")],
        [
            ("traceparent", TRACEPARENT),
            ("traceparent", TRACEPARENT.replace("0af7", "1af7")),
            ("tracestate", "rojo=1"),
        ],
    ],
    ids=["none", "malformed", "zero-trace-id", "duplicated"],
)
async def test_without_a_valid_traceparent_a_new_trace_starts(headers: list[tuple[str, str]]) -> None:
    """No traceparent, or a bad one, is a new root (no error), and no tracestate goes on. Two
    ``traceparent`` headers are no valid one (W3C's test suite, ``test_traceparent_duplicated``):
    the first was continued."""
    sink = MemorySink()
    async with _serving(_user_app(sink)) as client:
        reply = await client.post("/grade/c1", headers=headers)
    assert reply.status_code == 200, reply.text
    (finished,) = sink.of_type(OperationFinished)
    assert finished.parent_span_id is None and not finished.parent_remote
    assert finished.trace_id != TRACE_ID
    assert reply.json()["tracestate"] is None
    assert finished.received_ns is not None


async def test_a_websocket_route_runs_operations_too() -> None:
    """``operation(websocket, ...)``, ``telemetry(websocket)`` and ``Depends(incoming)`` work in a
    websocket route, spoken to as uvicorn does (they raised 'is not instrumented', reading the
    websocket's own state): the operation continues the caller's trace from its arrival."""
    sink = MemorySink()
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", configure_sinks=lambda bus: bus.subscribe(sink))

    @app.websocket("/grade")
    async def grade(websocket: WebSocket, brought: Annotated[Incoming, Depends(incoming)]) -> None:
        await websocket.accept()
        with operation(websocket, "commit", checkpoint_id="ws-1") as op:
            op.set(records=2)
        telemetry(websocket).refused("stale_attempt")
        await websocket.send_text(f"{brought.parent == parse_traceparent(TRACEPARENT)}")
        await websocket.close()

    sent, before = await spoken_websocket(app, "/grade", headers=[(b"traceparent", TRACEPARENT.encode())])
    assert [m["type"] for m in sent] == ["websocket.accept", "websocket.send", "websocket.close"]
    assert sent[1]["text"] == "True"
    (finished,) = sink.of_type(OperationFinished)
    assert (finished.checkpoint_id, finished.records, finished.trace_id) == ("ws-1", 2, TRACE_ID)
    assert finished.parent_span_id == PARENT_ID
    assert finished.received_ns is not None and before <= finished.received_ns <= finished.start_ns
    assert [e.code for e in sink.of_type(Refused)] == ["stale_attempt"]


async def test_middleware_added_after_instrument_runs_after_the_arrival_stamp() -> None:
    """Middleware added after ``instrument()`` (the README calls it right after ``FastAPI()``)
    ran before the stamp: 60 ms spent in a slow auth middleware was missing from the time the
    request waited, and an operation in that middleware had no ``received_ns``. (The handler's
    operation after the middleware's has none: its wait ended when the middleware's ended.)"""
    sink = MemorySink()
    app = _user_app(sink)

    @app.middleware("http")
    async def slow_auth(request: Request, call_next: Any) -> Any:
        if request.url.path.endswith("with-op"):
            with operation(request, "prepare", checkpoint_id="in-middleware"):
                await anyio.sleep(0)
        else:
            await anyio.sleep(0.06)
        return await call_next(request)

    async with _serving(app) as client:
        assert (await client.post("/grade/c1")).status_code == 200
        before = time.time_ns()
        assert (await client.post("/grade/with-op")).status_code == 200
    finished = {e.checkpoint_id: e for e in sink.of_type(OperationFinished)}
    commit, prepare = finished["c1"], finished["in-middleware"]
    assert commit.received_ns is not None and commit.start_ns - commit.received_ns >= 60_000_000
    assert prepare.received_ns is not None and before <= prepare.received_ns <= prepare.start_ns
    assert finished["with-op"].received_ns is None


@pytest.mark.parametrize("where", ["app", None, "request"])
async def test_operation_away_from_a_request_is_a_precise_error(where: str | None) -> None:
    """``operation(app, ...)`` (``telemetry(app)`` takes the app) or ``incoming(None)`` says what
    it takes, in one line (it was AttributeError: 'FastAPI' object has no attribute 'scope')."""
    app = _user_app(MemorySink())
    given = app if where == "app" else where
    with pytest.raises(InvalidTypeError, match=r"take the handler's Request \(or WebSocket\), not "):
        operation(given, "commit", checkpoint_id="c1")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="use telemetry\\(app\\).operation"):
        incoming(given)  # type: ignore[arg-type]


def test_a_request_built_by_hand_is_a_precise_error() -> None:
    """A ``Request(scope)`` built in a unit test, with no app in its scope, raised
    ``KeyError: 'app'`` from ``operation()`` and ``telemetry()``; it now says to serve it."""
    request = Request({"type": "http", "method": "POST", "path": "/grade/c1", "headers": []})
    for call in (lambda: telemetry(request), lambda: operation(request, "commit", checkpoint_id="c1")):
        with pytest.raises(ConfigurationError, match=r"served by no app.*ASGITransport"):
            call()


async def test_incoming_dependency_runs_on_the_event_loop() -> None:
    """``Depends(incoming_dependency)`` answers with every worker thread taken, and gives what
    ``incoming`` gives (FastAPI runs ``Depends(incoming)``, a plain ``def``, in its threadpool)."""
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", configure_sinks=lambda bus: None)

    @app.get("/caller")
    async def caller(brought: Annotated[Incoming, Depends(incoming_dependency)]) -> bool:
        return brought.parent == parse_traceparent(TRACEPARENT) and brought.received_ns is not None

    limiter = anyio.to_thread.current_default_thread_limiter()
    tokens = limiter.total_tokens
    limiter.total_tokens = 1
    try:
        async with _serving(app) as client, limiter:  # the one thread token, held
            with anyio.fail_after(5):
                reply = await client.get("/caller", headers={"traceparent": TRACEPARENT})
        assert reply.json() is True
    finally:
        limiter.total_tokens = tokens


async def test_instrument_twice_is_an_error() -> None:
    """A second instrument() on one app says so; the first stays in place."""
    app = FastAPI()
    first = instrument(app, kind="judge", instance="judge-0", configure_sinks=lambda bus: None)
    with pytest.raises(ConfigurationError, match="instrumented already"):
        instrument(app, kind="judge", instance="judge-1")
    assert telemetry(app) is first.telemetry and app.state.ckpt_events is first


async def test_the_lifespan_runs_again_with_a_fresh_bus(tmp_path: Path) -> None:
    """One app object whose lifespan runs once per test (a ``with TestClient(app)`` each) serves
    every run with telemetry on: a run after the first gets a fresh Telemetry and bus (the second
    run's startup failed with 'a Bus can be entered once; create a new one')."""
    sink = MemorySink()
    app = _user_app(sink)
    handle = app.state.ckpt_events
    first = handle.telemetry
    for checkpoint_id in ("c1", "c2", "c3"):
        async with _serving(app) as client:
            assert (await client.post(f"/grade/{checkpoint_id}")).status_code == 200
            assert telemetry(app) is handle.telemetry and handle.bus is handle.telemetry.bus
    assert handle.telemetry is not first and first.bus.stats().dropped_after_close == 0
    assert [e.checkpoint_id for e in sink.of_type(OperationFinished)] == ["c1", "c2", "c3"]
    path = tmp_path / "events.jsonl"  # sinks.configure() runs again on each run's bus
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", jsonl_path=str(path))
    for _ in range(2):
        async with app.router.lifespan_context(app):
            telemetry(app).refused("stale_attempt")
    assert len(list(read_events(path))) == 2


async def test_a_lifespan_left_by_another_task_delivers_and_says_so(tmp_path: Path) -> None:
    """The lifespan entered in one task and left in another (``lifespan_context`` in a
    pytest-asyncio async fixture: setup and teardown are two asyncio tasks) delivers what was
    emitted, closes the sinks, stops the loop-lag monitor and raises one line saying what to do
    instead (was anyio's "Attempted to exit cancel scope in a different task", twice, chained)."""
    sink = MemorySink()
    path = tmp_path / "events.jsonl"
    own = FastAPI()
    instrument(own, kind="judge", instance="judge-0", jsonl_path=str(path))
    for app in (_user_app(sink), own):
        await _enter_and_leave_in_two_tasks(app)
    assert sink.closed and [type(e) for e in sink.events] == [Refused]
    assert [type(event) for _, event in read_events(path)] == [Refused]
    with EventCapture() as capture:  # a bus the lifespan does not own: its monitor stops all the same
        tel = capture.telemetry("judge", "judge-0")
        on_capture = FastAPI()
        instrument(on_capture, telemetry=tel, bus=tel.bus)
        await _enter_and_leave_in_two_tasks(on_capture)
        assert [type(e) for e in capture.events] == [Refused]


async def _enter_and_leave_in_two_tasks(app: FastAPI) -> None:
    """Enter the app's lifespan in one asyncio task, emit, leave it in another (as
    pytest-asyncio runs an async fixture's setup and teardown), and check the error and tasks."""
    context = app.router.lifespan_context(app)
    raised: list[BaseException] = []

    async def setup() -> None:
        await context.__aenter__()
        telemetry(app).refused("stale_attempt")

    async def teardown() -> None:
        try:
            await context.__aexit__(None, None, None)
        except Exception as exc:  # checked below
            raised.append(exc)

    before = asyncio.all_tasks()
    await asyncio.create_task(setup())
    await asyncio.create_task(teardown())
    (error,) = raised
    assert isinstance(error, ConfigurationError)
    assert str(error).startswith("the instrumented app's lifespan was entered in one task and left")
    assert "LifespanManager" in str(error) and "\n" not in str(error)
    assert error.__context__ is None
    await anyio.sleep(0.01)  # the cancelled loop-lag monitor ends on the loop's next turn
    assert asyncio.all_tasks() <= before


async def test_a_lifespan_run_again_reports_no_stale_loop_lag() -> None:
    """The first operation of a lifespan run again (a ``with TestClient(app)`` per test) recorded
    the idle time between the runs as loop lag (~950 ms after a 1 s pause): the monitor kept the
    start of the sleep it was in when the previous run stopped it."""
    sink = MemorySink()
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", configure_sinks=lambda bus: bus.subscribe(sink))

    @app.post("/grade/{checkpoint_id}")
    async def grade(request: Request, checkpoint_id: str) -> None:
        with operation(request, "commit", checkpoint_id=checkpoint_id):
            pass  # no await: the operation may end before the new run's monitor first wakes

    for checkpoint_id in ("c1", "c2"):
        async with _serving(app) as client:
            assert (await client.post(f"/grade/{checkpoint_id}")).status_code == 200
            await anyio.sleep(0.1)  # the monitor samples a while before the run stops it
        await anyio.sleep(0.6)  # idle between the runs: nothing blocks the loop
    lags = {e.checkpoint_id: e.loop_lag_ms for e in sink.of_type(OperationFinished)}
    assert lags.keys() == {"c1", "c2"}
    assert all(lag is not None and lag < 100.0 for lag in lags.values()), lags


async def test_a_given_telemetry_s_lifespan_runs_once_and_one_at_a_time() -> None:
    """With ``telemetry=`` (its bus cannot be renewed) a second run says why in one line; a run
    while another runs is refused too."""
    app = FastAPI()
    tel = Telemetry(Bus(), kind="judge", instance="judge-0")
    instrument(app, telemetry=tel, configure_sinks=lambda bus: None)
    async with app.router.lifespan_context(app):
        with pytest.raises(ConfigurationError, match="running already"):
            async with app.router.lifespan_context(app):
                pass
    with pytest.raises(ConfigurationError, match="ran once already.*kind= and instance="):
        async with app.router.lifespan_context(app):
            pass


async def test_a_given_telemetry_on_a_running_bus_says_to_pass_bus() -> None:
    """``instrument(app, telemetry=capture.telemetry(...))`` without ``bus=``: the startup says
    the bus runs elsewhere and to pass ``bus=`` (it said 'a Bus can be entered once; create a
    new one', of a bus the user had not made); with ``bus=`` the app's events reach the capture."""
    with EventCapture() as capture:
        app = FastAPI()
        instrument(app, telemetry=capture.telemetry("judge", "judge-0"))
        with pytest.raises(ConfigurationError, match=r"entered elsewhere .* pass bus= that bus too"):
            async with app.router.lifespan_context(app):
                pass
        app = FastAPI()
        tel = capture.telemetry("judge", "judge-0")
        instrument(app, telemetry=tel, bus=tel.bus)

        @app.post("/grade")
        async def grade(request: Request) -> None:
            with operation(request, "commit", checkpoint_id="c1"):
                pass

        async with _serving(app) as client:
            assert (await client.post("/grade")).status_code == 200
        await capture.flush()
        (finished,) = capture.sink.of_type(OperationFinished)
        assert (finished.trace_id, finished.checkpoint_id) == (1, "c1")


async def test_bad_arguments_fail_at_instrument() -> None:
    """A misspelt sinks option or a half-given identity fails when instrument() is called."""
    # Python's own "got an unexpected keyword argument 'jsonl_pth'" named neither the call nor
    # the name meant.
    with pytest.raises(
        TypeError, match=r"instrument\(\) got an unknown option 'jsonl_pth' \(did you mean 'jsonl_path'\?\)"
    ):
        instrument(FastAPI(), kind="judge", instance="judge-0", jsonl_pth="x.jsonl")
    with pytest.raises(
        InvalidTypeError,
        match="options are ckpt_events.sinks.configure\\(\\)'s: tracer_provider, .*, export_process$",
    ):
        instrument(FastAPI(), kind="judge", instance="judge-0", colour="blue")
    with pytest.raises(ConfigurationError, match="not instrumented"):
        telemetry(FastAPI())
    with pytest.raises(ValueError, match="kind= and instance="):
        instrument(FastAPI(), kind="judge")  # type: ignore[call-overload]
    async with Bus() as bus:
        with pytest.raises(ValueError, match="caller configures"):
            instrument(FastAPI(), kind="judge", instance="judge-0", bus=bus, jsonl_path="x.jsonl")


async def test_a_plain_asgi_app_is_told_to_mount_and_a_wrapped_one_to_instrument_inside() -> None:
    """A plain ASGI app, or an app wrapped in middleware, was refused with "needs a FastAPI (or
    Starlette) app" and nothing more; the error now says what to do, and what it says works: the
    plain app mounted in a Starlette app records its operations, with their arrival. A router
    is told to instrument the app it is included in."""
    from starlette.applications import Starlette
    from starlette.middleware.cors import CORSMiddleware
    from starlette.routing import Mount

    async def plain(scope: Any, receive: Any, send: Any) -> None:
        with operation(Request(scope, receive), "commit", checkpoint_id="plain"):
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    with pytest.raises(InvalidTypeError, match=r"Starlette\(routes=\[Mount\('/', app=your_app\)\]\)"):
        instrument(plain, kind="judge", instance="judge-0")  # type: ignore[call-overload]
    wrapped = CORSMiddleware(app=FastAPI(), allow_origins=["*"])
    with pytest.raises(InvalidTypeError, match=r"instrument\(\) on that app where it is made, then wrap"):
        instrument(wrapped, kind="judge", instance="judge-0")  # type: ignore[call-overload]
    # A router is an ASGI app too, but mounting it (as the plain app's line says) is not the fix.
    with pytest.raises(InvalidTypeError, match=r"not a router .*: instrument the app .*include_router"):
        instrument(APIRouter(prefix="/r"), kind="judge", instance="judge-0")  # type: ignore[call-overload]
    sink = MemorySink()
    app = Starlette(routes=[Mount("/", app=plain)])
    instrument(app, kind="judge", instance="judge-0", configure_sinks=lambda bus: bus.subscribe(sink))
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as client,
    ):
        assert (await client.get("/anything")).text == "ok"
    (finished,) = sink.of_type(OperationFinished)
    assert (finished.checkpoint_id, finished.outcome) == ("plain", "ok")
    assert finished.received_ns is not None


async def test_bad_option_values_fail_at_instrument_and_change_nothing() -> None:
    """Values of the wrong type fail at instrument(), not at the first startup (``'str' object
    is not callable``); so does a call after the app has served (Starlette's bare "Cannot add
    middleware after an application has started"), which leaves the app as it was."""
    with pytest.raises(InvalidTypeError, match="configure_sinks must be a callable"):
        instrument(FastAPI(), kind="judge", instance="judge-0", configure_sinks="x")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError, match="loop_lag must be True or False, not 'yes'"):
        instrument(FastAPI(), kind="judge", instance="judge-0", loop_lag="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shutdown_timeout must be a number >= 0, not True"):
        instrument(FastAPI(), kind="judge", instance="judge-0", shutdown_timeout=True)
    app = FastAPI()

    @app.get("/")
    async def root() -> int:
        return 1

    async with _serving(app) as client:
        assert (await client.get("/")).json() == 1
    lifespan = app.router.lifespan_context
    for _ in range(2):  # a retry is refused the same way: nothing was wrapped the first time
        with pytest.raises(
            ConfigurationError,
            match="has built its middleware stack already .*: call instrument\\(\\) where the app is made",
        ):
            instrument(app, kind="judge", instance="judge-0", configure_sinks=lambda bus: None)
    assert app.router.lifespan_context is lifespan and not hasattr(app.state, "ckpt_events")


async def test_an_app_whose_stack_was_built_unserved_is_not_said_to_have_served() -> None:
    """``FastAPIInstrumentor.uninstrument_app(app)`` builds the app's middleware stack: a later
    ``instrument(app)`` is refused (no middleware can be added), but it said the app 'has
    served already', which it never did."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    app = FastAPI()
    FastAPIInstrumentor.instrument_app(app)
    FastAPIInstrumentor.uninstrument_app(app)
    with pytest.raises(ConfigurationError) as caught:
        instrument(app, kind="judge", instance="judge-0", configure_sinks=lambda bus: None)
    said = str(caught.value)
    assert "has served already" not in said and "has built its middleware stack already" in said
    assert "uninstrument_app()" in said


async def test_instrument_in_the_apps_own_lifespan_is_told_to_move_where_the_app_is_made() -> None:
    """Starlette builds the stack to run the lifespan: ``instrument(app)`` called in it said the
    app "has served", which it had not, naming no lifespan."""
    said: list[str] = []

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        with pytest.raises(ConfigurationError) as caught:
            instrument(app, kind="judge", instance="judge-0")
        said.append(str(caught.value))
        yield

    app = FastAPI(lifespan=lifespan)
    received = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    sent: list[Any] = []

    async def receive() -> Any:
        return next(received)

    async def send(message: Any) -> None:
        sent.append(message["type"])

    # As a server runs it (``lifespan_context`` entered directly builds no stack).
    await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert "run its lifespan" in said[0] and "where the app is made, not in its lifespan" in said[0]


async def test_jsonl_path_of_the_wrong_type_is_a_configuration_error() -> None:
    """``jsonl_path=123`` said ``TypeError: expected str, bytes or os.PathLike object, not int``."""
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", jsonl_path=123)
    with pytest.raises(
        ConfigurationError, match=r"jsonl_path must be a path \(a str or os.PathLike\), not 123"
    ):
        async with app.router.lifespan_context(app):
            pass


@pytest.mark.parametrize("where", ["startup", "shutdown"])
async def test_the_app_s_own_lifespan_error_comes_out_as_raised(where: str) -> None:
    """An app's lifespan that raises: the same exception reaches uvicorn or the test client, not
    an ``ExceptionGroup`` from our task group (``except RuntimeError`` stopped matching)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if where == "startup":
            raise RuntimeError("their startup failed")
        yield
        raise RuntimeError("their shutdown failed")

    sink = MemorySink()
    app = _user_app(sink, lifespan=lifespan)
    with pytest.raises(RuntimeError, match=f"their {where} failed") as caught:
        async with app.router.lifespan_context(app):
            pass
    assert type(caught.value) is RuntimeError
    assert sink.closed  # our bus drained and closed all the same


async def test_operation_attributes_are_checked_with_telemetry_off_too() -> None:
    """``operation(request, ..., retries=None)`` was a 200 with no sink and a 500 with one."""
    for sink in (None, MemorySink()):
        app = FastAPI()
        instrument(
            app,
            kind="judge",
            instance="judge-0",
            configure_sinks=(lambda bus: None) if sink is None else (lambda bus, s=sink: bus.subscribe(s)),
        )

        @app.get("/")
        async def root(request: Request) -> int:
            with pytest.raises(InvalidTypeError, match="a str, bool, int or float value, not 'retries'=None"):
                operation(request, "commit", checkpoint_id="c1", retries=None)
            return 1

        async with _serving(app) as client:
            assert telemetry(app).enabled is (sink is not None)
            assert (await client.get("/")).json() == 1


async def test_a_request_served_without_the_lifespan_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """An instrumented app mounted under another (Starlette runs no sub-app's lifespan) served
    requests with its telemetry silently off; it now says why, once."""
    sink = MemorySink()
    outer = FastAPI()
    outer.mount("/judge", _user_app(sink))
    transport = httpx.ASGITransport(app=outer)
    async with (
        outer.router.lifespan_context(outer),
        httpx.AsyncClient(transport=transport, base_url="http://t") as client,
    ):
        for _ in range(3):
            assert (await client.post("/judge/grade/c1")).status_code == 200
    said = [r.getMessage() for r in caplog.records if "lifespan never ran" in r.getMessage()]
    assert len(said) == 1 and "app.mount()" in said[0] and "--lifespan off" in said[0]
    assert sink.events == []
    # Served with its lifespan, nothing is said.
    caplog.clear()
    app = _user_app(MemorySink())
    async with _serving(app) as client:
        assert (await client.post("/grade/c1")).status_code == 200
    assert not [r for r in caplog.records if "lifespan never ran" in r.getMessage()]


async def test_a_sub_app_mounted_in_an_instrumented_app_is_told_to_drop_its_instrument(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With both apps instrumented, the mounted one's operations went to its own telemetry, off
    (Starlette runs no sub-app's lifespan), and the warning said to "instrument the app uvicorn
    serves", which was. It now names the outer app and says that without its own instrument()
    the sub-app's operations are the outer app's; and they are."""
    outer_sink = MemorySink()
    outer = FastAPI()
    instrument(outer, kind="gateway", instance="gw-0", configure_sinks=lambda bus: bus.subscribe(outer_sink))
    outer.mount("/judge", _user_app(MemorySink()))
    async with _serving(outer) as client:
        for _ in range(2):
            assert (await client.post("/judge/grade/c1")).status_code == 200
    said = [r.getMessage() for r in caplog.records if r.name == "ckpt_events"]
    assert len(said) == 1, said
    assert "gateway" in said[0] and "instrument()" in said[0], said[0]
    assert "uvicorn serves" not in said[0], said[0]
    # As it advises: the sub-app without instrument() records with the outer app's telemetry.
    plain = FastAPI()

    @plain.post("/grade/{checkpoint_id}")
    async def grade(request: Request, checkpoint_id: str) -> None:
        with operation(request, "commit", checkpoint_id=checkpoint_id):
            pass

    outer.mount("/plain", plain)
    async with _serving(outer) as client:
        assert (await client.post("/plain/grade/c2")).status_code == 200
    finished = outer_sink.of_type(OperationFinished)
    assert [(e.kind, e.checkpoint_id) for e in finished] == [("gateway", "c2")]


@pytest.mark.parametrize("inner_lifespan", [True, False])
async def test_the_outer_app_s_operation_after_a_mounted_instrumented_app_answered_is_its_own(
    inner_lifespan: bool,
) -> None:
    """Starlette's ``Mount`` hands the outer app's scope on, and a mounted instrumented app's
    stamp replaced the outer app's there: the outer app's middleware's operation after
    ``call_next`` recorded as the mounted app's participant (3 of 3 commits as
    environment/env-0), or, with the mounted app's lifespan not run (as Starlette runs none),
    was lost (0 of 3 recorded). Each app's code now records with its own."""
    sink = MemorySink()
    inner = FastAPI()
    instrument(inner, kind="environment", instance="env-0", configure_sinks=lambda bus: bus.subscribe(sink))

    @inner.post("/reset/{checkpoint_id}")
    async def reset(request: Request, checkpoint_id: str) -> None:
        with operation(request, "prepare", checkpoint_id=checkpoint_id):
            await anyio.sleep(0)

    outer = _user_app(sink)

    @outer.middleware("http")
    async def audit(request: Request, call_next: Any) -> Any:
        reply = await call_next(request)
        with operation(request, "retire", checkpoint_id=request.url.path):
            pass
        return reply

    outer.mount("/env", inner)
    async with _serving(outer) as client, AsyncExitStack() as stack:
        if inner_lifespan:  # as a user whose outer lifespan runs the mounted app's
            await stack.enter_async_context(inner.router.lifespan_context(inner))
        for k in range(3):
            assert (await client.post(f"/env/reset/c{k}")).status_code == 200
        assert (await client.post("/grade/c9")).status_code == 200
    got = sorted((e.kind, e.operation, e.checkpoint_id) for e in sink.of_type(OperationFinished))
    mine = [("judge", "retire", f"/env/reset/c{k}") for k in range(3)] + [("judge", "retire", "/grade/c9")]
    theirs = [("environment", "prepare", f"c{k}") for k in range(3)] if inner_lifespan else []
    assert got == sorted([*theirs, ("judge", "commit", "c9"), *mine])


async def test_a_request_after_the_lifespan_ended_is_not_said_to_have_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request served after the app's lifespan ran and ended (a test's client used after its
    ``with TestClient(app)``) was told 'its lifespan never ran (a sub-app under app.mount(), or
    uvicorn --lifespan off)': a wrong cause. It is said once, as what it is."""
    app = _user_app(MemorySink())
    async with app.router.lifespan_context(app):
        pass
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for _ in range(2):
            assert (await client.post("/grade/c1")).status_code == 200
    said = [r.getMessage() for r in caplog.records if r.name == "ckpt_events"]
    assert len(said) == 1, said
    assert "after its lifespan ended" in said[0] and "never ran" not in said[0]


async def test_shutdown_timeout_bounds_what_configure_sinks_returned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``configure_sinks``' handle whose ``aclose()`` hangs (60 s) is given up on at
    ``shutdown_timeout`` and its grace (it took its own 10 s default, whatever shutdown_timeout
    said), and said once."""

    class Stuck:
        async def aclose(self) -> None:
            await anyio.sleep(60)

    app = FastAPI()
    instrument(
        app, kind="judge", instance="judge-0", configure_sinks=lambda bus: Stuck(), shutdown_timeout=0.3
    )
    began = time.monotonic()
    async with app.router.lifespan_context(app):
        pass
    took = time.monotonic() - began
    assert 0.3 + CLOSE_GRACE_S <= took < 0.3 + CLOSE_GRACE_S + 0.5, f"given up on after {took:.2f} s"
    said = [r.getMessage() for r in caplog.records if "given up on" in r.getMessage()]
    assert len(said) == 1 and "Stuck) did not close within shutdown_timeout=0.3 s" in said[0], said


async def test_a_hung_collector_s_close_is_said_once_and_not_given_up_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A collector that takes the connection and never answers: the sinks' close ends by its
    own deadline (``shutdown_timeout``) and says the collector took the connection, once. The
    lifespan gave up on it at that same moment, and said so after it ("the sinks' handle
    (Configured) did not close within shutdown_timeout=10 s; given up on"): a second, wrong
    cause on every such shutdown (3 of 3 under uvicorn, SIGTERM, 10.2 s)."""
    caplog.set_level(logging.WARNING, logger="ckpt_events")
    collector = Hostile("hang")
    try:
        app = FastAPI()
        base = collector.url.removesuffix("/v1/traces")
        instrument(
            app, kind="judge", instance="judge-0", otlp_endpoint=base, environ={}, shutdown_timeout=0.5
        )

        @app.post("/grade/{checkpoint_id}")
        async def grade(request: Request, checkpoint_id: str) -> None:
            with operation(request, "commit", checkpoint_id=checkpoint_id):
                pass

        async with _serving(app) as client:
            for n in range(5):
                assert (await client.post(f"/grade/c{n}")).status_code == 200
            began = time.monotonic()
        took = time.monotonic() - began
    finally:
        collector.close()
    said = [r.getMessage() for r in caplog.records]
    assert not any("given up on" in m for m in said), said
    hung = [m for m in said if "OTLP span export" in m and "took the connection but gave no reply" in m]
    assert len(hung) == 1, said
    assert any("5 spans dropped in all, 0 exported" in m for m in said), said
    assert took < 0.5 + 1.0, f"closed in {took:.2f} s"


async def test_an_injected_clock_stamps_the_arrival_too() -> None:
    """With ``clock=`` (the capture's ``TickingClock``) the arrival is a reading of that clock,
    before the operation's start: it was the real wall clock, years after a ``TickingClock``'s
    start, so an instrumented app's events differed run after run."""
    runs = []
    for _ in range(2):
        with EventCapture() as capture:
            app = FastAPI()
            tel = capture.telemetry("judge", "judge-0")
            instrument(app, telemetry=tel, bus=tel.bus, loop_lag=False)

            @app.post("/grade")
            async def grade(request: Request) -> None:
                with operation(request, "commit", checkpoint_id="c1"):
                    pass

            async with _serving(app) as client:
                assert (await client.post("/grade")).status_code == 200
            await capture.flush()
            runs.append(capture.sink.of_type(OperationFinished))
    (finished,) = runs[0]
    assert finished.received_ns == CLOCK_START_NS and finished.start_ns == CLOCK_START_NS + 1_000_000
    assert runs[0] == runs[1]


async def test_a_started_bus_is_used_as_is() -> None:
    """With ``bus=`` the lifespan neither configures nor closes it; the handler's telemetry is on it."""
    sink = MemorySink()
    async with Bus() as bus:
        bus.subscribe(sink)
        app = FastAPI()
        handle = instrument(app, kind="rollout", instance="rollout-0", bus=bus, loop_lag=False)

        @app.get("/tel")
        async def tel(request: Request) -> bool:
            with operation(request, "prepare", checkpoint_id="c1"):
                return telemetry(request) is handle.telemetry

        async with _serving(app) as client:
            assert (await client.get("/tel")).json() is True
        await bus.flush()
        assert not sink.closed
    (finished,) = sink.of_type(OperationFinished)
    assert finished.kind == "rollout" and finished.received_ns is not None
    assert finished.loop_lag_ms is None  # loop_lag=False


async def test_configure_options_reach_sinks_configure(tmp_path: Path) -> None:
    """``jsonl_path`` and ``environ`` go to ``sinks.configure``; the environment's sampler is
    the Telemetry's ratio for traces started here."""
    path = tmp_path / "events.jsonl"
    environ = {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}
    app = FastAPI()
    handle = instrument(app, kind="judge", instance="judge-0", jsonl_path=path, environ=environ)

    @app.post("/")
    async def root(request: Request) -> bool:
        with operation(request, "commit", checkpoint_id="c1") as op:
            return op.sampled

    async with _serving(app) as client:
        assert handle.configured is not None and handle.configured.bus is handle.bus
        assert (await client.post("/")).json() is False  # ratio 0: a new trace is not sampled
        assert (await client.post("/", headers={"traceparent": TRACEPARENT})).json() is True
    assert handle.configured is None
    finished = [e for _, e in read_events(path) if isinstance(e, OperationFinished)]
    assert [e.parent_span_id for e in finished] == [None, PARENT_ID]


async def test_incoming_outside_an_instrumented_app_reads_only_the_headers() -> None:
    """``incoming(request)`` works on any app: the trace context, but no arrival."""
    app = FastAPI()
    seen: list[Incoming] = []

    @app.get("/")
    async def root(request: Request) -> None:
        seen.append(incoming(request))

    async with _serving(app) as client:
        await client.get("/", headers={"traceparent": TRACEPARENT, "tracestate": "rojo=1, bad"})
    (got,) = seen
    assert got.parent is not None and (got.parent.trace_id, got.parent.span_id) == (TRACE_ID, PARENT_ID)
    assert got.tracestate is None  # malformed: dropped whole, as W3C says
    assert got.received_ns is None and got.monitor is None


async def test_otel_context_nests_under_fastapi_instrumentor_s_server_span() -> None:
    """caller -> FastAPIInstrumentor's SERVER span -> our operation -> the handler's own span."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    from opentelemetry.propagate import inject
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind, set_span_in_context

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("the-app")
    app = FastAPI()
    # Our spans go through the app's provider (a configure option); the environment is left out.
    instrument(app, kind="judge", instance="judge-0", otel_context=True, tracer_provider=provider, environ={})
    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)

    @app.post("/grade")
    async def grade(request: Request) -> None:
        with operation(request, "commit", checkpoint_id="c1"), tracer.start_as_current_span("app.grade"):
            pass

    try:
        async with _serving(app) as client:
            # Not made current: the in-process ASGI app would inherit it (a real caller is
            # another process), and the instrumentation would then make no SERVER span.
            caller = tracer.start_span("caller", kind=SpanKind.CLIENT)
            headers: dict[str, str] = {}
            inject(headers, context=set_span_in_context(caller))
            assert (await client.post("/grade", headers=headers)).status_code == 200
            caller.end()
    finally:
        FastAPIInstrumentor.uninstrument_app(app)
    spans = {span.name: span for span in exporter.get_finished_spans()}
    (server,) = [s for s in spans.values() if s.kind is SpanKind.SERVER and s.name != "gym.checkpoint.commit"]
    ours, own = spans["gym.checkpoint.commit"], spans["app.grade"]
    trace_id = caller.get_span_context().trace_id
    assert {s.context.trace_id for s in (server, ours, own)} == {trace_id}
    assert server.parent is not None and server.parent.span_id == caller.get_span_context().span_id
    assert ours.parent is not None and ours.parent.span_id == server.context.span_id
    assert own.parent is not None and own.parent.span_id == ours.context.span_id
    provider.shutdown()


async def test_spans_reach_a_provider_the_app_shuts_down_in_its_own_lifespan() -> None:
    """The app's shutdown shuts its provider down (``provider.shutdown()``, ``logfire.shutdown()``):
    the spans of its last requests reached it first. The span sink holds spans up to a second
    before it hands them on, and our drain ran after their shutdown: all 3 were lost."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        provider.shutdown()

    app = FastAPI(lifespan=lifespan)
    instrument(app, kind="judge", instance="judge-0", tracer_provider=provider, environ={})

    @app.post("/commit")
    async def commit(request: Request) -> None:
        with operation(request, "commit", checkpoint_id="c1"):
            pass

    async with _serving(app) as client:
        for _ in range(3):
            assert (await client.post("/commit")).status_code == 200
    assert [span.name for span in exporter.get_finished_spans()] == ["gym.checkpoint.commit"] * 3


async def test_a_sink_stalled_at_shutdown_holds_it_two_shutdown_timeouts_at_most() -> None:
    """A sink that never finishes: the sinks' close gives up on it after ``shutdown_timeout``,
    and the delivery before the app's own shutdown (added so that a provider shut down by the
    app gets the requests' spans) and the bus's drain after it share one more (it was 3.0 s at
    1 s when each had its own)."""

    class Stalled:
        async def handle(self, batch: list[Any]) -> None:
            await anyio.sleep(60)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        telemetry(app).bus.subscribe(Stalled())
        yield

    app = FastAPI(lifespan=lifespan)
    instrument(app, kind="judge", instance="judge-0", environ={}, shutdown_timeout=1.0)

    @app.post("/commit")
    async def commit(request: Request) -> None:
        with operation(request, "commit", checkpoint_id="c1"):
            pass

    async with _serving(app) as client:
        assert (await client.post("/commit")).status_code == 200
        started = time.monotonic()
    assert time.monotonic() - started < 2 * 1.0 + 0.7  # three timeouts: 3.0 s


async def test_otel_context_across_threadpool_calls_logs_no_false_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With ``otel_context=True``, an operation open across a sync generator's chunks (a
    ``StreamingResponse``) or a sync ``yield`` dependency is entered in one threadpool call and
    left in another, each in a copy of the request's context: OpenTelemetry logged 'Failed to
    detach context' with a traceback on every such request, though nothing was left to restore."""
    from fastapi.responses import StreamingResponse
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", otel_context=True, tracer_provider=provider, environ={})

    @app.get("/stream")
    def stream(request: Request) -> StreamingResponse:
        def chunks() -> Iterator[bytes]:
            with operation(request, "commit", checkpoint_id="streamed"):
                yield from (b"a", b"b", b"c")

        return StreamingResponse(chunks())

    def prepared(request: Request) -> Iterator[bool]:
        with operation(request, "prepare", checkpoint_id="dependency"):
            yield trace.get_current_span().get_span_context().is_valid

    # Not Annotated[bool, Depends(prepared)]: FastAPI cannot resolve a local from a string annotation.
    @app.get("/dependency")
    def dependency(current: bool = Depends(prepared)) -> bool:
        return current

    async with _serving(app) as client:
        assert (await client.get("/stream")).content == b"abc"
        assert (await client.get("/dependency")).json() is True
        # Nothing leaked into the request's own context: no current span after the operation.
        assert not trace.get_current_span().get_span_context().is_valid
    spans = {s.attributes["nemo.gym.checkpoint.id"]: s for s in exporter.get_finished_spans() if s.attributes}
    assert spans.keys() == {"streamed", "dependency"}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    provider.shutdown()


async def test_http_exceptions_and_sync_handlers_keep_their_outcome_trace_and_handlers() -> None:
    """A sync ``def`` handler (FastAPI's threadpool) continues the caller's trace, its step the
    operation's child; an ``HTTPException`` (any status) ends the operation as ``error`` with its
    status in the message, and the app's own exception handlers still answer."""
    sink = MemorySink()
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", configure_sinks=lambda bus: bus.subscribe(sink))

    class Busy(Exception):
        """The app's own exception, answered by its own handler."""

    @app.exception_handler(Busy)
    async def answer_busy(request: Request, exc: Busy) -> JSONResponse:
        return JSONResponse({"busy": True}, status_code=429)

    @app.post("/sync/{checkpoint_id}")
    def sync(request: Request, checkpoint_id: str) -> dict[str, str | None]:
        with operation(request, "commit", checkpoint_id=checkpoint_id) as op:
            with op.step("write"):
                pass
            if checkpoint_id == "missing":
                raise HTTPException(404, "no such checkpoint")
            if checkpoint_id == "busy":
                raise Busy
            return {"traceparent": op.traceparent()}

    async with _serving(app) as client:
        reply = await client.post("/sync/c1", headers={"traceparent": TRACEPARENT})
        assert reply.status_code == 200
        assert (await client.post("/sync/missing")).status_code == 404
        assert (await client.post("/sync/busy")).json() == {"busy": True}
    ok, missing, busy = sink.of_type(OperationFinished)
    assert (ok.outcome, ok.trace_id, ok.parent_span_id) == ("ok", TRACE_ID, PARENT_ID)
    outgoing = parse_traceparent(reply.json()["traceparent"])
    assert outgoing is not None and outgoing.span_id == ok.span_id
    steps = {step.trace_id: step.parent_span_id for step in sink.of_type(StepFinished)}
    assert steps == {e.trace_id: e.span_id for e in (ok, missing, busy)}
    assert (missing.outcome, missing.error_type) == ("error", "fastapi.exceptions.HTTPException")
    assert missing.error_message == "404: no such checkpoint"
    assert busy.error_type is not None and busy.error_type.endswith(".Busy")


async def _left_mid_stream(app: FastAPI, path: str) -> int:
    """Serve one GET of ``path`` as an ASGI 2.3 server (uvicorn's, hypercorn's) does, its client
    leaving after the first body chunk: ``http.disconnect`` then; the chunks it got."""
    gone = anyio.Event()
    chunks = 0

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal chunks
        if message.get("body"):
            chunks += 1
            gone.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    with anyio.fail_after(10):
        await app(scope, receive, send)
    return chunks


async def test_a_stream_its_client_left_ends_its_operation_with_the_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A ``StreamingResponse``'s sync generator that the server stops iterating when the client
    leaves is never closed (Starlette drops it; the garbage collector finds it some time later):
    its operation stayed open, counted open, and was lost when the process exited (measured
    under uvicorn: never ended; hypercorn: ended 3.6 s later by the collector). It now ends with
    the request, outcome error ``RequestEnded``, once, even when the generator is collected."""
    sink = MemorySink()
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", configure_sinks=lambda bus: bus.subscribe(sink))

    @app.get("/stream")
    def stream(request: Request) -> StreamingResponse:
        def chunks() -> Iterator[bytes]:
            with operation(request, "restore", checkpoint_id="left"):
                yield from [b"x"] * 100

        return StreamingResponse(chunks())

    @app.get("/whole")
    def whole(request: Request) -> StreamingResponse:
        def chunks() -> Iterator[bytes]:
            with operation(request, "restore", checkpoint_id="whole"):
                yield from [b"x"] * 3

        return StreamingResponse(chunks())

    async with app.router.lifespan_context(app):
        assert await _left_mid_stream(app, "/stream") == 1
        await telemetry(app).bus.flush()
        (left,) = sink.of_type(OperationFinished)
        assert (left.checkpoint_id, left.outcome, left.error_type) == (
            "left",
            "error",
            "ckpt_events.participants.fastapi.RequestEnded",
        )
        gc.collect()  # the generator, closed at last: its operation is not ended again
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.get("/whole")).content == b"xxx"
    assert [(e.checkpoint_id, e.outcome) for e in sink.of_type(OperationFinished)] == [
        ("left", "error"),
        ("whole", "ok"),
    ]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def _docstring_example() -> str:
    """The example app of the module docstring, as a file's text."""
    assert fastapi_module.__doc__ is not None
    lines = fastapi_module.__doc__.split("::\n\n", 1)[1].splitlines()
    example = []
    for line in lines:
        if line and not line.startswith(" "):
            break
        example.append(line)
    return textwrap.dedent("\n".join(example))


@pytest.mark.e2e
async def test_a_user_app_under_uvicorn_logs_its_operations(tmp_path: Path) -> None:
    """A real uvicorn process on 127.0.0.1 serving the module docstring's example app: its
    JSON-lines log holds the operation, in the caller's trace, with its arrival; SIGTERM drains it."""
    (tmp_path / "user_app.py").write_text(_docstring_example())
    log = tmp_path / "events.jsonl"  # the example's jsonl_path, relative to its directory
    async with asgi_server("uvicorn", "user_app:app", tmp_path) as served:
        async with httpx.AsyncClient(base_url=served.url) as client:
            before = time.time_ns()
            reply = await client.post("/checkpoint/c-e2e", headers={"traceparent": TRACEPARENT})
        assert reply.status_code == 200, reply.text
    # uvicorn shuts down gracefully, then re-raises the signal it caught.
    assert served.process.returncode in (0, -signal.SIGTERM)
    events = [event for _, event in read_events(log)]
    (finished,) = [e for e in events if isinstance(e, OperationFinished)]
    assert (finished.kind, finished.instance, finished.checkpoint_id) == ("rollout", "rollout-0", "c-e2e")
    assert finished.records == 12
    assert (finished.trace_id, finished.parent_span_id, finished.parent_remote) == (TRACE_ID, PARENT_ID, True)
    assert finished.received_ns is not None and before <= finished.received_ns <= finished.start_ns
    assert [e.parent_span_id for e in events if isinstance(e, StepFinished)] == [finished.span_id]


async def test_the_loop_runs_while_the_lifespan_starts_the_export_process(tmp_path: Path) -> None:
    """``instrument(..., export_process=True)``: the lifespan's start of the export process (a
    Python interpreter building the sinks) held the loop, a 1 ms ticker's worst gap the whole
    start (0.26-0.48 s); it is now waited for in a worker thread, and the child still gets the
    request's operation."""
    log = tmp_path / "events.jsonl"
    app = FastAPI()
    instrument(app, kind="judge", instance="judge-0", jsonl_path=log, export_process=True, loop_lag=False)

    @app.post("/commit")
    async def commit(request: Request) -> dict[str, int]:
        with operation(request, "commit", checkpoint_id="c1") as op:
            op.set(records=2)
        return {"records": 2}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        async with ticking() as gaps:
            started = time.monotonic()
            async with app.router.lifespan_context(app):
                took = time.monotonic() - started
                start_gaps = gaps[:]  # the start's, not the request's
                assert app.state.ckpt_events.configured.export_process is not None
                assert (await client.post("/commit")).json() == {"records": 2}
    assert took > 0.05 and len(start_gaps) >= 10, (took, len(start_gaps))
    assert max(start_gaps) < took / 2, (max(start_gaps), took)
    finished = [e for _, e in read_events(log) if isinstance(e, OperationFinished)]
    assert [(e.checkpoint_id, e.records) for e in finished] == [("c1", 2)]
