"""``BusThread``: a ``Bus`` running on an event loop in a thread of its own, for synchronous code.

A WSGI app under gunicorn's sync workers, a thread pool, a plain training script: ``with
BusThread() as bus:`` starts the bus on an AnyIO blocking portal's thread and yields it, and
leaving the block closes it there (drained within its ``close_timeout``) and ends the thread.
While it runs, ``bus.subscribe`` (and so ``sinks.configure(bus)``) works from any thread: the
call is made on the bus's loop and waited for. ``emit`` and the span handles need nothing: they
are safe from any thread already.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Final, TypeVar, overload

import anyio
import anyio.from_thread

from ckpt_events._bus import Bus
from ckpt_events._bus_log import logger
from ckpt_events._errors import InvalidValueError
from ckpt_events._public_home import publish

__all__ = ["BusThread"]

T = TypeVar("T")


class BusThread:
    """A ``Bus`` (``self.bus``, built from ``bus_options``) run on a thread of its own.

    ``start()`` (or entering ``with``) starts the thread and the bus and returns the bus;
    ``close()`` (or leaving the block, also by an exception) closes the bus within its
    ``close_timeout``, delivering what was emitted and closing the sinks, then ends the thread;
    what no sink got (dropped, failed, abandoned at the deadline) is said in one warning and
    stays in ``bus.stats()``. One started and never closed (a WSGI module's global) is closed
    as the interpreter exits. Started once: a second ``start()``, or one after ``close()``,
    raises ``InvalidValueError``; ``close()`` is idempotent. In a process forked while it runs
    (gunicorn ``--preload``), the thread stays in the parent: the child's copy of the bus counts
    what it is given as dropped (as any bus does) and ``close()`` there returns at once.
    """

    def __init__(self, **bus_options: Any) -> None:
        self.bus = Bus(**bus_options)
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._bus_context: AbstractContextManager[Bus] | None = None
        self._thread: threading.Thread | None = None
        self._ready: Future[anyio.from_thread.BlockingPortal] = Future()
        self._pid: int | None = None
        self._started = False
        self._closed = False
        self._lock = threading.Lock()  # start() and close() from two threads at once

    def start(self) -> Bus:
        """Start the bus on its own thread; returns it, running."""
        with self._lock:
            if self._started:
                raise InvalidValueError(
                    "this BusThread has been started already (a BusThread runs once): use its bus, "
                    "or create a new BusThread"
                )
            self._started = True
            # A thread and portal of our own, not anyio's start_blocking_portal(): that one's
            # generator, dropped in a forked child, stopped the parent's portal from the child
            # as it was collected and waited for ever (the child hung).
            thread = threading.Thread(target=_run_portal, args=(self._ready,), name=THREAD_NAME, daemon=True)
            thread.start()
            self._thread = thread
            try:
                portal = self._ready.result()
                bus_context = portal.wrap_async_context_manager(self.bus)
                bus_context.__enter__()
            except BaseException:
                # The bus failed to start: the thread stopped, not left running an event loop.
                self._closed = True
                self._stop()
                raise
            self._portal = portal
            self._bus_context = bus_context
            self._pid = os.getpid()
            self.bus._from_other_thread = portal.call
            _close_at_exit(self)
        return self.bus

    @overload
    def call(self, func: Callable[..., Awaitable[T]], *args: Any) -> T: ...

    @overload
    def call(self, func: Callable[..., T], *args: Any) -> T: ...

    def call(self, func: Callable[..., Any], *args: Any) -> Any:
        """Run ``func(*args)`` on the bus's loop (a coroutine function is awaited there) and return
        its result, from any thread but that loop's; ``InvalidValueError`` when not running."""
        portal = self._portal
        if portal is None or self._pid != os.getpid():
            state = "closed" if self._closed else "not started"
            raise InvalidValueError(f"this BusThread is {state}: call it between start() and close()")
        return portal.call(func, *args)

    def flush(self, timeout: float | None = None) -> bool:
        """``await bus.flush(timeout)`` from synchronous code: waits, on this thread, until every
        event emitted before the call has been handled by every sink; ``False`` if ``timeout``
        seconds passed first (the events stay pending). From any thread but the bus's loop;
        ``InvalidValueError`` when not running. ``bus.flush(5.0)`` itself, called from sync
        code, returns a coroutine: it waits for nothing, and it is true."""
        return self.call(self.bus.flush, timeout)

    def close(self) -> None:
        """Close the bus (within its ``close_timeout``) and end its thread; idempotent."""
        with self._lock:
            if self._closed or not self._started:
                self._closed = True
                return
            self._closed = True
            self._portal = None
            if self._pid != os.getpid():
                return  # forked while running: the loop's thread is the parent's, nothing runs here
            _OPEN.pop(self, None)
            bus_context = self._bus_context
            self._bus_context = None
            assert bus_context is not None and self._thread is not None
            try:
                bus_context.__exit__(None, None, None)
            finally:
                self.bus._from_other_thread = None
                self._stop()
        _say_what_was_lost(self.bus)

    def _stop(self) -> None:
        """Stop the portal's loop (once the bus is closed nothing else runs there) and join it."""
        if self._ready.exception() is None:
            portal = self._ready.result()
            try:
                portal.call(portal.stop, True)
            except RuntimeError:  # it has stopped already
                pass
        assert self._thread is not None
        self._thread.join()

    def __enter__(self) -> Bus:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


#: The thread's name, as ``threading.enumerate()`` shows it.
THREAD_NAME: Final = "ckpt-events-bus"


def _run_portal(ready: Future[anyio.from_thread.BlockingPortal]) -> None:
    """The thread's body: an event loop running a portal until it is stopped."""

    async def serve() -> None:
        async with anyio.from_thread.BlockingPortal() as portal:
            ready.set_result(portal)
            await portal.sleep_until_stopped()

    try:
        anyio.run(serve)
    except BaseException as exc:  # handed to start(), which raises it
        if not ready.done():
            ready.set_exception(exc)


#: Every BusThread started in this process and not yet closed, closed at exit in reverse order.
_OPEN: Final[dict[BusThread, None]] = {}
_exit_hook: list[bool] = []  # registered (once, at the first start(), not at import)


def _close_at_exit(runner: BusThread) -> None:
    _OPEN[runner] = None
    if _exit_hook:
        return
    _exit_hook.append(True)
    # Before the atexit handlers: with atexit, the OpenTelemetry MeterProvider that configure()
    # built after start() (its own handler registered later, so run first) was shut down before
    # the bus drained, and every metric of the run was lost (0 of 10 operations exported). This
    # is the hook concurrent.futures uses; without it (another interpreter), atexit.
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading._register_atexit")
        register(_close_open)
    except RuntimeError:  # the interpreter is exiting already, or no such hook
        atexit.register(_close_open)


def _close_open() -> None:
    for runner in reversed(list(_OPEN)):
        runner.close()


def _say_what_was_lost(bus: Bus) -> None:
    """One warning when the closed bus's sinks did not get every event emitted."""
    stats = bus.stats()
    dropped = sum(s.dropped for s in stats.sinks)
    failed = sum(s.failed for s in stats.sinks)
    abandoned = sum(s.abandoned for s in stats.sinks)
    if dropped or failed or abandoned:
        logger.warning(
            "BusThread closed its bus: %d events dropped (buffers full), %d failed in a sink, %d "
            "abandoned at the %.1f s close deadline (per sink: bus.stats())",
            dropped,
            failed,
            abandoned,
            bus.close_timeout,
        )


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events", BusThread)
