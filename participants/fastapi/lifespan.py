"""An instrumented app's telemetry for its lifetime (``Instrumented``), and the middleware
that stamps each request's arrival (and the ``Instrumented`` app it reached) on its scope.

Part of ``ckpt_events.participants.fastapi``, which re-exports ``Instrumented``.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable, Mapping, MutableMapping
from contextlib import AbstractContextManager, AsyncExitStack, asynccontextmanager
from contextvars import ContextVar
from types import TracebackType
from typing import Any, Final

import anyio
from starlette.types import ASGIApp, Receive, Scope, Send

from ckpt_events import (
    Bus,
    CkptEventsError,
    ConfigurationError,
    InvalidValueError,
    OperationFinished,
    OperationSpan,
    Telemetry,
)
from ckpt_events.checks import library_logger
from ckpt_events.participants.fastapi.incoming import Incoming, WrappedOperation
from ckpt_events.participants.fastapi.server_log import escaped
from ckpt_events.participants.loop_lag import LoopLagMonitor

__all__ = [
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "SCOPE_KEY",
    "STATE_ATTRIBUTE",
    "Arrival",
    "ArrivalMiddleware",
    "ArrivedIncoming",
    "Instrumented",
    "RequestEnded",
    "ResponseStartMiddleware",
    "arrival_of",
]

logger: Final = library_logger("ckpt_events")

#: The ``app.state`` attribute holding an instrumented app's ``Instrumented``.
STATE_ATTRIBUTE: Final = "ckpt_events"
#: The request-scope key of a request's arrival (set by the middleware).
SCOPE_KEY: Final = "ckpt_events.arrival"
#: The arrival of the mounted instrumented app whose code runs in this context (unset in the
#: outermost app's, which has no app around it): ``arrival_of`` tells the apps of one request apart.
_MOUNTED: Final[ContextVar[Arrival | None]] = ContextVar("ckpt_events_mounted_arrival", default=None)
#: The bus's and the sinks' shutdown deadline (seconds), each.
DEFAULT_SHUTDOWN_TIMEOUT: Final = 10.0
#: Seconds the lifespan waits for the sinks' handle past ``shutdown_timeout``, which is also the
#: handle's own close deadline (``Configured.close_timeout``): ``Configured`` ends its exports
#: in flight and shuts its meter provider down after that deadline (at most a second each).
#: Giving up at the same moment said "did not close ... given up on" after every hung
#: collector's close, which ended by itself 0.2 s later, having said its own cause.
_CLOSE_GRACE_S: Final = 2.0
#: An instrumented app's lifespan entered in one task and left in another.
LIFESPAN_LEFT_IN_ANOTHER_TASK: Final = (
    "the instrumented app's lifespan was entered in one task and left in another, as "
    "`async with app.router.lifespan_context(app)` in a pytest-asyncio async fixture is (its "
    "setup and teardown run as two tasks); what was emitted was delivered and the sinks closed. "
    "Enter it with asgi_lifespan.LifespanManager(app), which runs it in a task of its own, or in "
    "the test itself, or run async tests with anyio's pytest plugin"
)


class Instrumented:
    """What ``instrument`` gave one app: its ``telemetry``, that telemetry's ``bus``, the
    ``monitor`` of its loop lag (``None`` with ``loop_lag=False``) and, while the lifespan runs,
    ``configured``: what configuring the sinks returned (``ckpt_events.sinks.Configured``)."""

    def __init__(
        self,
        telemetry: Telemetry,
        *,
        owns_bus: bool,
        configure_sinks: Callable[[Bus], Any] | None,
        monitor: LoopLagMonitor | None,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        renew: Callable[[], Telemetry] | None = None,
        renew_first: bool = False,
    ) -> None:
        self.telemetry = telemetry
        self.bus = telemetry.bus
        self.monitor = monitor
        self.configured: Any = None
        self.shutdown_timeout = shutdown_timeout
        #: Whether the lifespan is running (``running()`` entered): a request served without it
        #: (a mounted sub-app, ``--lifespan off``, or after shutdown) finds the telemetry off,
        #: and says so once.
        self.started = False
        self._warned = False
        self._owns_bus = owns_bus
        self._configure_sinks = configure_sinks
        # A bus is entered once, and a test suite runs an app's lifespan once per test (a
        # `with TestClient(app)` each): a run after the first gets a fresh Telemetry and bus.
        self._renew = renew
        # instance= a callable: even the first run's Telemetry is built at its start, in the
        # process that serves (gunicorn --preload imports the app in its master).
        self._renew_first = renew_first
        self._runs = 0
        self._running = False
        # Why configuring the sinks failed this run (a port taken, a bad variable): the server's
        # log says it in one line rather than the lifespan's traceback (ArrivalMiddleware).
        self._startup_failure: CkptEventsError | None = None

    def __repr__(self) -> str:
        return f"Instrumented({self.telemetry!r}, owns_bus={self._owns_bus})"

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The telemetry's lifetime around the app's: enter the bus and configure the sinks
        (when this owns the bus), run the loop-lag monitor; on exit stop it, close the sinks'
        handle and drain the bus, each within ``shutdown_timeout`` (the handle is given up on
        ``_CLOSE_GRACE_S`` past it, so that one ending by that same deadline ends and says why).

        What the app's own lifespan raises comes out as it was raised (the monitor's task
        group is left before it is re-raised, so it is never wrapped in an ``ExceptionGroup``).

        Each run after the first gets a fresh ``telemetry`` and ``bus`` (the lifespan of one app
        object run once per test); a ``telemetry=`` given to ``instrument`` cannot be renewed,
        so its app's lifespan runs once, and a second run raises ``ConfigurationError``."""
        if self._running:
            raise ConfigurationError(
                f"{self.telemetry!r}: the app's lifespan is running already; one app object "
                "runs one lifespan at a time"
            )
        if self._owns_bus and (self._runs or self._renew_first):
            if self._renew is None:
                raise ConfigurationError(
                    f"the lifespan of the app instrumented with {self.telemetry!r} ran once already, "
                    "and the telemetry= given to instrument() has a bus that runs once: build the app "
                    "anew for each run, or instrument it with kind= and instance="
                )
            self._startup_failure = None
            try:
                renewed = self._renew()
            except CkptEventsError as exc:  # instance= a callable that raised or named no name
                self._startup_failure = exc
                raise
            self.telemetry = renewed
            self.bus = renewed.bus
        self._runs += 1
        self._running = True
        host_task = anyio.get_current_task().id
        async with AsyncExitStack() as stack:
            stack.callback(setattr, self, "_running", False)
            if self._owns_bus:
                try:
                    await stack.enter_async_context(self.bus)
                except InvalidValueError as exc:  # Bus.__aenter__'s one refusal: entered before
                    raise ConfigurationError(
                        f"the bus of the telemetry= given to instrument() ({self.telemetry!r}) was "
                        "entered elsewhere (an EventCapture's, a Bus your code runs): while it runs, "
                        "pass bus= that bus too, and the lifespan uses it as it is"
                    ) from exc
                if self._configure_sinks is not None:
                    self._startup_failure = None
                    try:
                        handle = self._configure_sinks(self.bus)
                        if inspect.isawaitable(handle):
                            handle = await handle
                    except CkptEventsError as exc:
                        self._startup_failure = exc
                        raise
                    self.configured = handle
                    stack.callback(setattr, self, "configured", None)
                    if handle is not None and hasattr(handle, "aclose"):
                        stack.push_async_callback(self._close_within, handle)
            self.started = True
            stack.callback(setattr, self, "started", False)
            raised: BaseException | None = None
            tg = anyio.create_task_group()
            await tg.__aenter__()
            try:
                if self.monitor is not None:
                    # On demand: sampled while an operation is open, no timer while none is.
                    run = functools.partial(self.monitor.run, on_demand=True)
                    await tg.start(run, functools.partial(self.bus.wants, OperationFinished))
                try:
                    yield
                except BaseException as exc:  # re-raised below, outside the task group
                    raised = exc
                finally:
                    tg.cancel_scope.cancel()
            finally:
                # Left by the task that entered it only (anyio refuses any other): a lifespan
                # left in another task has its monitor cancelled above, and says so below.
                left_elsewhere = anyio.get_current_task().id != host_task
                if not left_elsewhere:
                    await tg.__aexit__(None, None, None)
            if raised is not None:
                try:
                    raise raised
                finally:
                    raised = None  # no reference cycle through the traceback
            if left_elsewhere:
                # Raised inside the stack, so the bus is drained and closed first.
                raise ConfigurationError(LIFESPAN_LEFT_IN_ANOTHER_TASK)

    async def delivered(self) -> None:
        """Wait (within ``shutdown_timeout``) until the events emitted so far are handled by
        the sinks of the bus this lifespan owns; the app's own shutdown runs next.

        A provider the app shuts down there (``logfire.shutdown()``, ``provider.shutdown()``)
        otherwise missed what the sinks still held: a span sink waits up to a second before
        it hands spans on, and 10 of 40 spans of 20 requests were lost, uncounted behind
        logfire's processors. The time it takes comes off the bus's drain after, so a sink
        that never finishes holds the shutdown no longer than before (``shutdown_timeout`` for
        this and the drain together, one more for the sinks' close: 2.0 s at 1 s, measured).
        """
        if self._owns_bus and self.started:
            started = time.monotonic()
            await self.bus.flush(self.shutdown_timeout)
            self.bus.close_timeout = max(0.0, self.bus.close_timeout - (time.monotonic() - started))

    async def _close_within(self, handle: Any) -> None:
        """``handle.aclose()`` (what configuring the sinks returned), given up on past
        ``shutdown_timeout`` seconds and a grace of ``_CLOSE_GRACE_S`` for a handle that ends
        by its own deadline of ``shutdown_timeout`` (``Configured``) to end and say why."""
        with anyio.move_on_after(self.shutdown_timeout + _CLOSE_GRACE_S) as scope:
            await handle.aclose()
        if scope.cancelled_caught:
            logger.warning(
                "the sinks' handle (%s) did not close within shutdown_timeout=%g s (and %g s of "
                "grace); given up on",
                type(handle).__name__,
                self.shutdown_timeout,
                _CLOSE_GRACE_S,
            )

    def _lifespan_missing(self, outer: Instrumented | None = None) -> None:
        """A request reached the app while its lifespan was not running: said once, with the
        cause (it never ran, or it ran and ended; ``outer``: the running instrumented app it is
        mounted in, if any)."""
        self._warned = True
        if outer is not None and outer is not self and outer.started and not self._runs:
            # "Instrument the app uvicorn serves" was the advice here, and it was instrumented.
            logger.warning(
                "ckpt_events: %r is mounted in an app instrumented as %r, and Starlette runs no "
                "lifespan for a mounted app, so this one's telemetry is off: drop the mounted "
                "app's instrument() call, and its operation(request) records with the outer app's",
                self.telemetry,
                outer.telemetry,
            )
            return
        if self._runs:  # it ran: "never ran (a sub-app, --lifespan off)" would be a wrong cause
            logger.warning(
                "ckpt_events: %r serves requests after its lifespan ended (the app shut down), so "
                "its telemetry is off: send requests while the lifespan runs (e.g. inside "
                "`with TestClient(app)`)",
                self.telemetry,
            )
            return
        logger.warning(
            "ckpt_events: %r serves requests but its lifespan never ran (a sub-app under "
            "app.mount(), or uvicorn --lifespan off), so its telemetry is off: instrument the app "
            "uvicorn serves, or run the lifespan",
            self.telemetry,
        )


class RequestEnded(CkptEventsError):
    """The error an operation of ``operation(request)`` ends with when its request ended first:
    recorded (outcome ``error``, this error type), never raised."""

    __module__ = "ckpt_events.participants.fastapi"


class Arrival:
    """One request's arrival time (Unix ns), the ``Instrumented`` app it reached, the
    operations of ``operation(request)`` entered and not yet left (``open``), the arrival
    the instrumented app this one is mounted in stamped (``outer``, ``None`` if none), and
    whether an operation starting now still waited from the arrival (``waiting``)."""

    __slots__ = ("instrumented", "open", "outer", "received_ns", "waiting")

    def __init__(self, received_ns: int, instrumented: Instrumented, outer: Arrival | None = None) -> None:
        self.received_ns = received_ns
        self.instrumented = instrumented
        self.open: list[HeldOperation] = []
        self.outer = outer
        #: True until an operation of the request ends or its response starts: an operation
        #: begun after either spent the time since the arrival on the server's own work, not
        #: queued (a second operation after a 300 ms first one read "queued 301 ms").
        self.waiting = True

    def wait_over(self) -> None:
        """No operation begun from now on waited from this arrival (nor from the arrivals of
        the apps this one is mounted in, which see the same request)."""
        arrival: Arrival | None = self
        while arrival is not None:
            arrival.waiting = False
            arrival = arrival.outer

    def end_open(self) -> None:
        """End every operation still open as the request ends, with ``RequestEnded``: a
        ``StreamingResponse``'s sync generator that the server stopped iterating (its client
        left) is never closed until the garbage collector finds it, so its operation stayed
        open (counted open, and never ended at all when the process exited first)."""
        while self.open:
            try:
                held = self.open.pop()
            except IndexError:  # its own __exit__ on another thread took the last one
                return
            held.abandon()


def arrival_of(scope: Mapping[str, Any]) -> Arrival | None:
    """The arrival stamped on ``scope`` by the instrumented app whose code runs here.

    Starlette's ``Mount`` hands the outer app's scope dict on, so a mounted instrumented app's
    stamp replaced the outer app's: the outer app's ``operation(request)`` after the mounted
    one answered (in its middleware, its exception handlers) recorded as the mounted app's
    participant, or was lost with that app's telemetry off (Starlette runs no mounted app's
    lifespan). Which app's code runs is in the context: a mounted app's arrival is set in it
    while that app handles the request (``BaseHTTPMiddleware`` runs the rest of the app in a
    child task, which has a copy), and unset, the outermost app's.
    """
    found: Arrival | None = scope.get(SCOPE_KEY)
    if found is None or found.outer is None:  # one instrumented app: the common case
        return found
    current = _MOUNTED.get()
    arrival = found
    while arrival.outer is not None:
        if arrival is current:
            return arrival
        arrival = arrival.outer
    return arrival  # the outermost app's: none of this request's mounted apps runs here


class HeldOperation(WrappedOperation):
    """An operation of ``operation(request)``, kept on its request's ``Arrival`` while it is
    open, so that the request's end can end it (``Arrival.end_open``). Exactly one of its own
    exit and the request's end ends it: each takes it off ``open`` first (one atomic step).

    It gets the arrival as its ``received_ns`` when it starts while the request still waits
    (``Arrival.waiting``: no operation of the request ended, no response started), and none
    (unknown) otherwise; its end ends the wait of any operation begun after it."""

    __slots__ = ("_arrival",)

    def __init__(self, operation: Any, arrival: Arrival) -> None:
        self._operation = operation  # the OperationSpan, or incoming's wrapper timing the loop lag
        self._arrival = arrival

    def __enter__(self) -> OperationSpan:
        handle: OperationSpan = self._operation.__enter__()
        arrival = self._arrival
        if arrival.waiting:  # decided as it starts, not when operation(request) was called
            handle.set(received_ns=arrival.received_ns)
        arrival.open.append(self)
        return handle

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        arrival = self._arrival
        try:
            arrival.open.remove(self)
        except ValueError:
            return  # ended when its request ended: recorded once, as what it was then
        arrival.wait_over()
        self._operation.__exit__(exc_type, exc, tb)

    def abandon(self) -> None:
        """End the operation now, outcome ``error`` with ``RequestEnded``."""
        ended = RequestEnded(
            "the request ended with this operation still open (code left unfinished, such as a "
            "StreamingResponse's generator the server stopped iterating when its client left)"
        )
        self._operation.__exit__(RequestEnded, ended, None)


class ArrivedIncoming(Incoming):
    """``incoming(request)`` of an instrumented app's request: an operation made from it ends the
    request's wait as it ends, as ``operation(request)``'s does (``Arrival.wait_over``): an
    ``operation(request)`` after a 100 ms ``incoming(request).operation(...)`` read "queued
    100 ms". The arrival is an attribute, not a field: the tuple stays ``Incoming``'s four."""

    arrival: Arrival | None = None  # None on a copy (``_replace``): its operations end no wait

    def __repr__(self) -> str:
        return repr(Incoming._make(self))  # what incoming() is documented to give

    def operation(
        self, tel: Telemetry, name: str, *, checkpoint_id: str | None = None, **attributes: Any
    ) -> AbstractContextManager[OperationSpan]:
        made = super().operation(tel, name, checkpoint_id=checkpoint_id, **attributes)
        arrival = self.arrival
        if arrival is None or not tel.enabled:  # a no-op handle records nothing
            return made
        return _EndingTheWaitOnExit(made, arrival)


class _EndingTheWaitOnExit(WrappedOperation):
    """An operation of ``ArrivedIncoming``: its end ends its request's wait."""

    __slots__ = ("_arrival",)

    _operation: AbstractContextManager[OperationSpan]

    def __init__(self, operation: AbstractContextManager[OperationSpan], arrival: Arrival) -> None:
        self._operation = operation
        self._arrival = arrival

    def __enter__(self) -> OperationSpan:
        return self._operation.__enter__()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._arrival.wait_over()
        self._operation.__exit__(exc_type, exc, tb)


class ArrivalMiddleware:
    """Stamps each HTTP request (and websocket) with its arrival time, before routing, parsing or auth."""

    def __init__(self, app: ASGIApp, instrumented: Instrumented) -> None:
        self.app = app
        self.instrumented = instrumented

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._failure_in_one_line(send))
            return
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        instrumented = self.instrumented
        outer = arrival_of(scope)  # an instrumented app this one is mounted in stamped it
        # The Telemetry's clock: an injected one (a TickingClock) stamps the arrival too, so
        # received_ns is not the real time beside a span started at the test clock's time.
        arrival = Arrival(instrumented.telemetry.clock(), instrumented, outer)
        scope[SCOPE_KEY] = arrival
        # Mounted: which app's code runs is told by the context (arrival_of); the outermost
        # app's is the unset default, so a single app pays nothing for it.
        mounted = None if outer is None else _MOUNTED.set(arrival)
        if not instrumented.started and instrumented._owns_bus and not instrumented._warned:
            instrumented._lifespan_missing(None if outer is None else outer.instrumented)
        try:
            await self.app(scope, receive, send)
        except BaseException as exc:
            escaped(exc)  # the server's log of it is redacted (``server_log``); re-raised as is
            raise
        finally:
            if arrival.open:
                arrival.end_open()
            if mounted is not None:
                _MOUNTED.reset(mounted)

    def _failure_in_one_line(self, send: Send) -> Send:
        """``send`` with a startup failure of ours said in one line: Starlette sends the lifespan's
        traceback as the failure's message, and uvicorn and gunicorn log it as it is (a port taken
        by a sibling worker: 20 lines per worker, the cause on the last)."""
        instrumented = self.instrumented

        async def sending(message: MutableMapping[str, Any]) -> None:
            failure = instrumented._startup_failure
            if message["type"] == "lifespan.startup.failed" and failure is not None:
                message = {**message, "message": f"ckpt-events: {failure}"}
            await send(message)

        return sending


class ResponseStartMiddleware:
    """Ends the request's wait as the app's own response starts, inside the app's middleware
    (``_stamp_first`` keeps it the innermost): ``BaseHTTPMiddleware`` (``@app.middleware("http")``)
    sends a ``StreamingResponse``'s start on only once its body is under way, so the generator's
    operation after a 200 ms handler read "queued 203 ms" with the start watched outside it.
    Only here, not in ``ArrivalMiddleware`` too: a second watch cost ~0.8 us a request.
    A websocket's accept ends no wait: the connect is its first operation's."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        arrival = arrival_of(scope) if scope["type"] == "http" else None
        if arrival is None:
            await self.app(scope, receive, send)
            return

        async def sending(message: MutableMapping[str, Any]) -> None:
            # An operation begun after the response started (in a StreamingResponse's body, a
            # BackgroundTasks task) spent the time since the arrival after the handler had
            # answered (one in BackgroundTasks read "queued 306 ms").
            if message["type"] == "http.response.start":
                arrival.wait_over()
            await send(message)

        await self.app(scope, receive, sending)
