"""Your own FastAPI server, instrumented in one call (extra ``server``).

``instrument(app, kind=..., instance=...)`` gives ``app``:

* **a bus and its sinks for the app's lifetime**: the app's lifespan enters a ``Bus``, awaits
  ``ckpt_events.sinks.aconfigure(bus, **configure_options)`` (JSON lines, OpenTelemetry, ...
  from the arguments and the environment; an export process's start is waited for in a worker
  thread, so the loop runs on meanwhile), and at shutdown flushes and closes both, each step
  within ``shutdown_timeout`` seconds. It wraps the lifespan the app already has (FastAPI's
  ``lifespan=`` or ``on_startup``/``on_shutdown``): telemetry is up before the app's startup
  runs and drained after its shutdown has run, so both may emit;
* **the arrival time of every request**, read by a pure ASGI middleware before routing, body
  parsing and auth (Unix-epoch ns, from the ``Telemetry``'s clock: an injected ``clock=``
  stamps it too), which becomes an operation's ``received_ns``: the time a
  request queued in the server before its handler started is then visible in traces. Only
  operations begun before any other of the request ended and before its response started
  get it: one begun later (a second one, one in ``BackgroundTasks``, a websocket's second
  message's) has none, its wait unknown;
* **the event loop's lag** (on by default, ``loop_lag=False`` turns it off): a task sleeps
  50 ms at a time and keeps how much each sleep overshot, and each operation records the worst
  lag seen while it ran (``loop_lag_ms``): a loop blocked by other work shows up there. It
  samples only while an operation is open and a sink wants ``OperationFinished`` (checked once
  a second while an operation is open and none does), and sleeps with no timer while no
  operation is open, so an idle server pays no wake-ups for it; an operation it did not sample
  from start to end (begun while no sink wanted the lag) has no ``loop_lag_ms`` (unknown),
  never a 0.0 unmeasured. The monitor is ``ckpt_events.participants.loop_lag.LoopLagMonitor``,
  re-exported here.
* **a redacted server log of an escaped exception**: an exception that leaves the app through
  its middleware is logged by uvicorn (``uvicorn.error``) or hypercorn (``hypercorn.error``)
  with its traceback; a filter put on those loggers gives such a record a stand-in whose
  messages are redacted, escaped and cut, as the library's own records are
  (``ckpt_events.participants.fastapi.server_log``). The exception object is not touched:
  your handlers and outer middleware get it as raised.

In a handler, ``operation(request, name, checkpoint_id=...)`` is the context manager of one
operation: ``with`` gives exactly the handle ``Telemetry.operation`` gives (``op.step(...)``,
``op.set(...)``, ``op.traceparent()`` for outgoing calls), a child of the caller's span when the
request carried a valid W3C ``traceparent`` (its ``tracestate`` kept and passed on by
``op.tracestate()``), else the root of a new trace; a malformed header, or several
``traceparent`` headers, are ignored, never an error. ``telemetry(request)`` (or
``telemetry(app)``) is the app's ``Telemetry`` for anything else (``refused``,
``prepare_not_ready``, ...). An example, served by ``uvicorn app:app``
(``tests/participants/test_fastapi.py`` runs it so)::

    from fastapi import FastAPI, Request

    from ckpt_events.participants.fastapi import instrument, operation

    app = FastAPI()
    instrument(app, kind="rollout", instance="rollout-0", jsonl_path="events.jsonl")


    @app.post("/checkpoint/{checkpoint_id}")
    async def checkpoint(request: Request, checkpoint_id: str) -> dict[str, str | None]:
        with operation(request, "commit", checkpoint_id=checkpoint_id) as op:
            with op.step("write"):
                records = [b"{}"] * 12  # your state, written somewhere
            op.set(records=len(records))
            return {"traceparent": op.traceparent()}  # what a call made here sends on

With ``otel_context=True`` operations join OpenTelemetry's context instead: under
``FastAPIInstrumentor``'s SERVER span, the operation is that span's child, and the app's own
OpenTelemetry spans opened inside it are its children.

``incoming(request)`` is what ``operation`` reads from a request (an ``Incoming``: the caller's
parent, its tracestate, the arrival; ``Depends(incoming_dependency)`` in a route's signature);
code that runs an operation away from the handler (the reference participants' control plane)
takes the ``Incoming`` and calls its ``operation(tel, name, ...)``. ``instrument(app,
telemetry=tel)`` instruments an app with a ``Telemetry`` built beforehand, and ``bus=`` a bus
the caller has started (and closes): then the lifespan owns no bus. The reference participants
(``ckpt_events.participants.create_app``) are built this way.
"""

from __future__ import annotations

import difflib
import inspect
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractContextManager, asynccontextmanager
from typing import Any, Final, TypeVar, overload

try:
    from starlette.applications import Starlette
    from starlette.requests import HTTPConnection
    from starlette.routing import Router
    from starlette.types import ASGIApp
except ModuleNotFoundError as _exc:
    # Without the server extra this was a bare "No module named 'starlette'", naming no install.
    if (_exc.name or "").partition(".")[0] != "starlette":
        raise
    raise ModuleNotFoundError(
        f"{__name__} needs 'starlette' (FastAPI), which is not installed: pip install 'ckpt-events[server]'",
        name=_exc.name,
    ) from _exc

from ckpt_events import (
    Bus,
    ConfigurationError,
    ContextBridge,
    InvalidArgumentError,
    InvalidTypeError,
    InvalidValueError,
    OperationSpan,
    Telemetry,
)
from ckpt_events.checks import shown
from ckpt_events.participants.fastapi.incoming import Incoming
from ckpt_events.participants.fastapi.lifespan import DEFAULT_SHUTDOWN_TIMEOUT as DEFAULT_SHUTDOWN_TIMEOUT
from ckpt_events.participants.fastapi.lifespan import STATE_ATTRIBUTE as STATE_ATTRIBUTE
from ckpt_events.participants.fastapi.lifespan import (
    Arrival,
    ArrivalMiddleware,
    ArrivedIncoming,
    HeldOperation,
    Instrumented,
    RequestEnded,
    ResponseStartMiddleware,
    arrival_of,
)
from ckpt_events.participants.fastapi.server_log import redact_server_log
from ckpt_events.participants.loop_lag import LoopLagMonitor

#: What ``_incoming`` builds: an ``Incoming``, or ``incoming()``'s ``ArrivedIncoming``.
_Brought = TypeVar("_Brought", bound=Incoming)

__all__ = [
    "Incoming",
    "Instrumented",
    "LoopLagMonitor",
    "RequestEnded",
    "incoming",
    "incoming_dependency",
    "instrument",
    "operation",
    "telemetry",
]


def __dir__() -> list[str]:
    # The API and the dunders: dir() and tab completion listed every import beside it
    # (``os``, ``difflib``, ``Bus``, ``shown``): 55 names for 9.
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})


def incoming(request: HTTPConnection) -> Incoming:
    """What ``request`` (a ``Request`` or a ``WebSocket``) brought (see ``Incoming``; a request
    with several ``traceparent`` headers has none valid; no ``received_ns`` once an operation
    of the request ended or its response started); usable as a FastAPI dependency; anything
    else raises ``InvalidTypeError``."""
    _check_request(request)
    arrival = arrival_of(request.scope)
    found = _incoming(request, arrival, waited=True, kind=ArrivedIncoming)
    found.arrival = arrival  # its operations end the request's wait as operation(request)'s do
    return found


def _check_request(request: object) -> None:
    if not isinstance(request, HTTPConnection):
        # The app itself (telemetry(app) takes one) was an AttributeError: 'FastAPI' ... 'scope'.
        raise InvalidTypeError(
            f"operation() and incoming() take the handler's Request (or WebSocket), not {shown(request)}; "
            "away from a request, use telemetry(app).operation(...)"
        )


def _incoming(
    request: HTTPConnection, arrival: Arrival | None, *, waited: bool, kind: type[_Brought]
) -> _Brought:
    """``incoming(request)`` as a ``kind``, its ``received_ns`` left out unless ``waited`` (and
    the request still waits: the arrival is no wait once it is over)."""
    headers = request.headers
    parents = headers.getlist("traceparent")
    # Two traceparent headers are no valid one: W3C's test suite expects a new trace (the first
    # was continued, whichever caller sent it).
    traceparent = parents[0] if len(parents) == 1 else None
    states = headers.getlist("tracestate")
    if arrival is None:
        return kind.from_headers(traceparent, ",".join(states) if states else None)
    return kind.from_headers(
        traceparent,
        ",".join(states) if states else None,
        received_ns=arrival.received_ns if waited and arrival.waiting else None,
        monitor=arrival.instrumented.monitor,
    )


async def incoming_dependency(request: HTTPConnection) -> Incoming:
    """``incoming(request)`` as an ``async def``, for ``Depends(incoming_dependency)``: FastAPI
    runs a plain ``def`` dependency (``Depends(incoming)``) in its threadpool, a thread hop per
    request (+200-370 us measured here) that also waits for a free worker thread."""
    return incoming(request)


def _instrumented(where: HTTPConnection | Starlette) -> Instrumented:
    # HTTPConnection, not Request: a WebSocket is one too (it read the WebSocket's own state).
    if isinstance(where, HTTPConnection):
        arrival = arrival_of(where.scope)
        if arrival is not None:
            return arrival.instrumented
        if "app" not in where.scope:  # `.app` raised KeyError: 'app' for a Request(scope) built by hand
            raise ConfigurationError(
                "the request was served by no app (a Request built by hand): send it through the "
                "instrumented app (httpx.ASGITransport, TestClient), or use telemetry(app)"
            )
        where = where.app
    found = getattr(getattr(where, "state", None), STATE_ATTRIBUTE, None)
    if not isinstance(found, Instrumented):
        raise ConfigurationError(
            f"{shown(where)} is not instrumented: call "
            f"ckpt_events.participants.fastapi.instrument(app, ...) first"
        )
    return found


def telemetry(where: HTTPConnection | Starlette) -> Telemetry:
    """The ``Telemetry`` of the instrumented app serving ``where`` (a request, a websocket, or the app
    itself, e.g. in its lifespan); ``ConfigurationError`` if the app is not instrumented."""
    return _instrumented(where).telemetry


def operation(
    request: HTTPConnection, name: str, *, checkpoint_id: str | None = None, **attributes: Any
) -> AbstractContextManager[OperationSpan]:
    """The operation ``name`` of the handler serving ``request`` (or a ``WebSocket``): ``with``
    gives the handle ``Telemetry.operation`` gives, a child of the caller's span (W3C
    ``traceparent``, its ``tracestate`` kept), with ``received_ns`` (the request's arrival, when
    it starts before any operation of the request ended and before the response started; else
    none), ``loop_lag_ms`` and ``attributes`` set. See ``Incoming.operation``.

    One still open when its request has ended (a ``StreamingResponse``'s generator the server
    stopped iterating when the client left) is ended then, outcome ``error`` with
    ``RequestEnded``; an operation meant to outlive its request is
    ``incoming(request).operation(telemetry(request), ...)``."""
    _check_request(request)  # first: a wrong type of `request` is an InvalidTypeError
    tel = telemetry(request)
    arrival = arrival_of(request.scope)
    held = arrival if tel.enabled else None  # a no-op handle records nothing to end
    # A held one's received_ns is decided as it starts (HeldOperation.__enter__), by the wait then.
    span = _incoming(request, arrival, waited=held is None, kind=Incoming).operation(
        tel, name, checkpoint_id=checkpoint_id, **attributes
    )
    return span if held is None else HeldOperation(span, held)


def _env_ratio(options: Mapping[str, Any]) -> float:
    from ckpt_events import sinks

    environ = options.get("environ")
    return sinks.sample_ratio_from_env(os.environ if environ is None else environ)


def _configure_with(options: Mapping[str, Any], shutdown_timeout: float) -> Callable[[Bus], Any]:
    from ckpt_events import sinks

    # Checked now, so a misspelt option fails at instrument(), not at the first startup.
    known = [name for name in inspect.signature(sinks.configure).parameters if name != "bus"]
    unknown = [name for name in options if name not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f" (did you mean {shown(close[0])}?)" if close else ""
        raise InvalidTypeError(
            f"instrument() got an unknown option {shown(unknown[0])}{hint}; its options are "
            f"ckpt_events.sinks.configure()'s: {', '.join(known)}"
        )

    async def configure(bus: Bus) -> Any:
        # Was sinks.configure: an export process's start (0.26-0.48 s) held the loop, a 1 ms
        # ticker's worst gap as long; aconfigure waits for it in a worker thread.
        configured = await sinks.aconfigure(bus, **options)
        configured.close_timeout = shutdown_timeout
        return configured

    return configure


@overload
def instrument(
    app: Starlette,
    *,
    kind: str,
    instance: str | Callable[[], str],
    bus: Bus | None = None,
    configure_sinks: Callable[[Bus], Any] | None = None,
    sample_ratio: float | None = None,
    otel_context: bool | ContextBridge = False,
    loop_lag: bool = True,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    **configure_options: Any,
) -> Instrumented: ...


@overload
def instrument(
    app: Starlette,
    *,
    telemetry: Telemetry,
    bus: Bus | None = None,
    configure_sinks: Callable[[Bus], Any] | None = None,
    loop_lag: bool = True,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    **configure_options: Any,
) -> Instrumented: ...


def instrument(
    app: Starlette,
    *,
    kind: str | None = None,
    instance: str | Callable[[], str] | None = None,
    telemetry: Telemetry | None = None,
    bus: Bus | None = None,
    configure_sinks: Callable[[Bus], Any] | None = None,
    sample_ratio: float | None = None,
    otel_context: bool | ContextBridge = False,
    loop_lag: bool = True,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    **configure_options: Any,
) -> Instrumented:
    """Give ``app`` a ``Telemetry`` of participant ``kind``/``instance``, the bus and sinks
    for its lifetime, arrival stamps and loop lag (see the module docstring); returns the
    ``Instrumented`` (also ``app.state.ckpt_events``). Call it once per app, before it serves;
    the arrival stamp runs before the app's own middleware, added before or after this call.

    * ``configure_options`` go to ``ckpt_events.sinks.aconfigure(bus, ...)`` (``jsonl_path``,
      ``otlp_endpoint``, ``span_groups``, ``tracer_provider``, ...), run in the lifespan;
      ``configure_sinks(bus)`` replaces that call (its result, awaited if awaitable, has its
      ``aclose()`` awaited at shutdown).
    * ``sample_ratio`` (default: ``OTEL_TRACES_SAMPLER``/``_ARG`` of ``environ``, read now; 1.0
      with ``configure_sinks`` or ``bus``, whose sinks the environment does not configure) and
      ``otel_context`` (operations join the current OpenTelemetry span) go to the ``Telemetry``.
    * ``instance``: a name, or a zero-argument callable returning one, called at the start of
      each run of the lifespan, in the process that serves (under ``gunicorn --preload`` the
      app is imported in the master, so ``f"judge-{os.getpid()}"`` named every worker after
      it; ``lambda: f"judge-{os.getpid()}"`` names each worker). What it raises or returns
      that is no valid name fails that startup, in one line of the server's log.
    * ``telemetry`` (instead of ``kind``/``instance``): a ``Telemetry`` built beforehand.
    * ``bus``: a bus the caller has started and will close (the ``Telemetry``'s): the lifespan
      then neither enters, configures nor closes it.
    * ``shutdown_timeout`` bounds the sinks' close (``configure_options``' sinks, or what
      ``configure_sinks`` returned) and the drain of a bus made here, each (seconds). The
      sinks configured here close by that deadline and say why; a handle whose close hangs
      past it is given up on 2 s later (the grace of that close), in one line.

    A second call on the same app, or a call once its middleware stack is built (it has
    served), raises ``ConfigurationError`` (and changes nothing); bad arguments raise
    ``InvalidArgumentError`` (``InvalidTypeError``, a ``TypeError``, for an unknown
    ``configure_options`` name, with the closest known one).
    """
    if not isinstance(app, Starlette):
        raise InvalidTypeError(_not_an_app(app))
    if isinstance(getattr(app.state, STATE_ATTRIBUTE, None), Instrumented):
        raise ConfigurationError(f"{shown(app)} is instrumented already: call instrument() once per app")
    if app.middleware_stack is not None:  # built: too late to add ours
        # Built by the app's first call, or without one (FastAPIInstrumentor.uninstrument_app).
        raise ConfigurationError(
            f"{shown(app)} has built its middleware stack already (it has served, or run its "
            "lifespan, or something built it, such as FastAPIInstrumentor.uninstrument_app()): "
            "call instrument() where the app is made, not in its lifespan, before it serves"
        )
    if (
        not isinstance(shutdown_timeout, int | float)
        or isinstance(shutdown_timeout, bool)
        or not shutdown_timeout >= 0
    ):
        raise InvalidValueError(f"shutdown_timeout must be a number >= 0, not {shown(shutdown_timeout)}")
    if not isinstance(loop_lag, bool):
        raise InvalidTypeError(f"loop_lag must be True or False, not {shown(loop_lag)}")
    if configure_sinks is not None and not callable(configure_sinks):
        raise InvalidTypeError(
            f"configure_sinks must be a callable taking the bus, not {shown(configure_sinks)}"
        )
    if bus is not None and (configure_sinks is not None or configure_options):
        raise InvalidValueError("with bus= the caller configures its sinks: no configure_sinks or options")
    if configure_sinks is not None and configure_options:
        raise InvalidValueError(
            f"configure_sinks replaces sinks.configure(): no options for it ({', '.join(configure_options)})"
        )
    tel, renew, named_at_start = _telemetry_for(
        telemetry,
        kind=kind,
        instance=instance,
        bus=bus,
        configure_sinks=configure_sinks,
        sample_ratio=sample_ratio,
        otel_context=otel_context,
        shutdown_timeout=shutdown_timeout,
        configure_options=configure_options,
    )
    if configure_sinks is None and bus is None:
        configure_sinks = _configure_with(configure_options, float(shutdown_timeout))
    handle = Instrumented(
        tel,
        owns_bus=bus is None,
        configure_sinks=configure_sinks,
        monitor=LoopLagMonitor() if loop_lag else None,
        shutdown_timeout=float(shutdown_timeout),
        renew=renew,
        renew_first=named_at_start,
    )
    their = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        # Ours around theirs: telemetry is up for their startup and drained after their shutdown.
        async with handle.running(), their(app) as state:
            yield state
            await handle.delivered()  # before their shutdown, which may shut their providers

    app.router.lifespan_context = lifespan
    app.add_middleware(ArrivalMiddleware, instrumented=handle)
    app.add_middleware(ResponseStartMiddleware)
    _stamp_first(app)
    redact_server_log()
    setattr(app.state, STATE_ATTRIBUTE, handle)
    return handle


def _not_an_app(app: object) -> str:
    """Why ``instrument(app)`` refuses ``app``, and what to pass instead: the app inside a
    middleware wrapping it (``CORSMiddleware(app=FastAPI())``), the app a router is included in
    (an ``APIRouter`` was told to mount it as a plain ASGI app), or a plain ASGI app mounted in
    a Starlette app (it was "needs a FastAPI (or Starlette) app", saying neither)."""
    if isinstance(app, Router):  # an ASGI app too, but mounting it loses the app's middleware
        return (
            f"instrument() needs the FastAPI (or Starlette) app, not a router ({shown(app)}): "
            "instrument the app the router is included in (app.include_router(router))"
        )
    inner = app
    for _ in range(32):  # bounded: a chain of middleware, each holding the next as `.app`
        inner = getattr(inner, "app", None)
        if isinstance(inner, Starlette):
            return (
                f"instrument() needs the FastAPI (or Starlette) app itself, not {shown(app)} wrapping "
                "it: call instrument() on that app where it is made, then wrap it"
            )
        if inner is None:
            break
    if not callable(app):
        return f"instrument() needs a FastAPI (or Starlette) app, not {shown(app)}"
    return (
        f"instrument() needs a FastAPI (or Starlette) app, not {shown(app)}: mount a plain ASGI app "
        "in one, app = Starlette(routes=[Mount('/', app=your_app)]), and instrument that (Starlette "
        "runs no lifespan of a mounted app: move its startup and shutdown to Starlette(lifespan=...))"
    )


def _stamp_first(app: Starlette) -> None:
    """Keep the arrival stamp the outermost of the app's own middleware, and the watch for the
    response's start the innermost, whenever its stack is built: ``add_middleware`` puts each
    one added later outside those before it, so middleware added after ``instrument()`` ran
    before the stamp (its time missing from the wait, an operation in it without
    ``received_ns``)."""
    build = app.build_middleware_stack  # Starlette's, or a wrapper (FastAPIInstrumentor's)
    # Objects: mypy sees no overlap of a class with the generic factory.
    stamp: object = ArrivalMiddleware
    watch: object = ResponseStartMiddleware

    def build_middleware_stack() -> ASGIApp:
        # Stable: the rest keep their order, between the two.
        app.user_middleware.sort(key=lambda m: 0 if m.cls is stamp else 2 if m.cls is watch else 1)
        return build()

    # On the instance, as FastAPIInstrumentor wraps it: an instrumentation wrapped after this
    # calls this as the original, and one wrapped before is called by it.
    app.build_middleware_stack = build_middleware_stack  # type: ignore[method-assign]


def _telemetry_for(
    telemetry: Telemetry | None,
    *,
    kind: str | None,
    instance: str | Callable[[], str] | None,
    bus: Bus | None,
    configure_sinks: Callable[[Bus], Any] | None,
    sample_ratio: float | None,
    otel_context: bool | ContextBridge,
    shutdown_timeout: float,
    configure_options: Mapping[str, Any],
) -> tuple[Telemetry, Callable[[], Telemetry] | None, bool]:
    """``instrument``'s ``Telemetry``: ``telemetry`` checked against the other arguments, or one
    built for ``kind``/``instance`` on ``bus`` (a new bus without one); when the bus is new, how
    to build the same ``Telemetry`` on a fresh bus (for the lifespan's next run); and whether
    the first run builds one too (``instance`` a callable, named in the process that serves)."""
    if telemetry is None:
        if kind is None or instance is None:
            raise InvalidValueError("instrument() needs kind= and instance= (or telemetry=)")
        if sample_ratio is None:
            # What sinks.configure() would read (a continued trace keeps its caller's decision).
            sample_ratio = (
                1.0 if configure_sinks is not None or bus is not None else _env_ratio(configure_options)
            )
        ratio = sample_ratio

        def build(the_bus: Bus, name: str) -> Telemetry:
            return Telemetry(the_bus, kind=kind, instance=name, sample_ratio=ratio, otel_context=otel_context)

        if isinstance(instance, str):
            if bus is not None:
                return build(bus, instance), None, False
            fixed = instance
            return (
                build(Bus(close_timeout=shutdown_timeout), fixed),
                lambda: build(Bus(close_timeout=shutdown_timeout), fixed),
                False,
            )
        naming = _instance_callable(instance)
        if bus is not None:
            raise InvalidValueError(
                "instance= a callable is called at each start of the lifespan, whose bus is its own: "
                "with bus=, pass the instance's name as a string"
            )
        # Never served with: a request before the lifespan (or without one) finds it off. Its
        # kind and sample ratio are checked now, as a string instance's are.
        waiting = build(Bus(close_timeout=shutdown_timeout), _NAMED_AT_START)

        def named() -> Telemetry:
            name = _call_instance(naming)
            try:
                return build(Bus(close_timeout=shutdown_timeout), name)
            except InvalidArgumentError as exc:  # the check a string instance gets at instrument()
                raise ConfigurationError(f"instance={shown(naming)} returned {shown(name)}: {exc}") from exc

        return waiting, named, True
    if not isinstance(telemetry, Telemetry):
        raise InvalidTypeError(f"telemetry must be a ckpt_events.Telemetry, not {shown(telemetry)}")
    if kind is not None or instance is not None or sample_ratio is not None or otel_context is not False:
        raise InvalidValueError("with telemetry=, kind, instance, sample_ratio and otel_context are its own")
    if bus is not None and bus is not telemetry.bus:
        raise InvalidValueError("bus= must be the telemetry's own bus")
    return telemetry, None, False


#: The instance of an app's ``Telemetry`` whose ``instance=`` callable has not run yet (before
#: the lifespan's start): it never emits into a sink, but shows in ``telemetry(app)``'s repr.
_NAMED_AT_START: Final = "named-at-lifespan-start"


def _instance_callable(instance: object) -> Callable[[], str]:
    """``instance`` checked as a callable taking no argument (``InvalidTypeError`` otherwise),
    at ``instrument()``, not at the first startup."""
    rule = "a name (1-128 characters of [A-Za-z0-9._-] starting with a letter or digit)"
    if not callable(instance):
        raise InvalidTypeError(f"instance must be {rule} or a callable returning one, not {shown(instance)}")
    try:
        signature = inspect.signature(instance)
    except (TypeError, ValueError):  # a builtin without one: its call says
        return instance
    try:
        signature.bind()
    except TypeError:
        raise InvalidTypeError(
            f"instance= a callable is called with no argument, and {shown(instance)} takes "
            f'{signature}: pass e.g. lambda: f"judge-{{os.getpid()}}"'
        ) from None
    return instance


def _call_instance(instance: Callable[[], str]) -> str:
    """What ``instance()`` returned; what it raised is a ``ConfigurationError`` naming the
    callable as the cause (the lifespan's startup fails, said in one line)."""
    try:
        return instance()
    except Exception as exc:  # re-raised, chained: the server's log says which callable failed
        raise ConfigurationError(
            f"instance={shown(instance)} raised {type(exc).__name__}: {exc} at the lifespan's "
            "start: it must return this process's instance name"
        ) from exc
