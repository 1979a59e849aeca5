"""Helpers for testing code that emits checkpoint events, shipped with the library.

``MemorySink`` keeps every event it is handed; ``capture_events()`` runs a block against a
fresh started bus with one ``MemorySink`` subscribed::

    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="resources", instance="r0")
        with tel.operation("commit", checkpoint_id="c1"):
            ...
    assert [type(e) for e in events] == [OperationStarted, OperationFinished]

The block's events are flushed into ``events`` when it ends.

``EventCapture`` does the same from synchronous and asynchronous code alike (its bus runs in
a thread of its own), and its ``telemetry()`` draws ids from ``SequentialIds`` and time from
``TickingClock``, so events compare equal run after run. The pytest plugin (``ckpt_capture``
and the OpenTelemetry fixtures) is built on it.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Self, TypeVar

import anyio.to_thread

from ckpt_events._bus import Bus
from ckpt_events._bus_thread import BusThread
from ckpt_events._errors import InvalidTypeError, InvalidValueError, check_int, check_number, shown
from ckpt_events._events import Event
from ckpt_events._sink import Sink
from ckpt_events._subscription import resolve_interests
from ckpt_events._telemetry import Telemetry
from ckpt_events._vocab import Kind

__all__ = ["CLOCK_START_NS", "EventCapture", "MemorySink", "SequentialIds", "TickingClock", "capture_events"]

#: ``TickingClock``'s default start: 2023-11-14T22:13:20Z, in nanoseconds.
CLOCK_START_NS = 1_700_000_000_000_000_000
#: Seconds ``EventCapture.flush_sync`` waits for the sinks before it raises ``TimeoutError``.
FLUSH_TIMEOUT = 30.0

E = TypeVar("E", bound=Event)


def __dir__() -> list[str]:
    # The API and the dunders: dir() and tab completion listed every import beside it
    # (``threading``, ``check_int``, ``Bus``, ``TypeVar``): 30 names for 6.
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})


class MemorySink:
    """A sink that appends every event to ``events`` and counts the batches it got."""

    def __init__(self, interests: Iterable[type[Event]] | None = None) -> None:
        # Read once (an iterator is kept as a tuple) and checked here, as the bus would check it:
        # a bool or an int was a bare TypeError from tuple(), before any bus was started.
        listed = isinstance(interests, Iterable) and not isinstance(interests, str | type)
        self.interests: Any = tuple(interests) if listed else interests  # type: ignore[arg-type]
        resolve_interests(self)
        self.events: list[Any] = []
        self.batches = 0
        self.closed = False

    def handle(self, batch: list[Event]) -> None:
        self.batches += 1
        self.events.extend(batch)

    async def aclose(self) -> None:
        self.closed = True

    def of_type(self, cls: type[E]) -> list[E]:
        """The events that are instances of ``cls``, in order; ``InvalidTypeError`` when ``cls``
        is not a class (a tuple or union of them too)."""
        try:
            # Checked before the events: a name ("Refused") found nothing among no events, so an
            # assertion that none was emitted passed whatever was.
            isinstance(None, cls)
        except TypeError:
            raise InvalidTypeError(
                f"of_type takes an event class (or a tuple or union of them), such as "
                f"ckpt_events.Refused, not {shown(cls)}"
            ) from None
        return [e for e in self.events if isinstance(e, cls)]

    def clear(self) -> None:
        self.events.clear()


@asynccontextmanager
async def capture_events(
    interests: Iterable[type[Event]] | None = None, **bus_options: Any
) -> AsyncIterator[tuple[Bus, list[Any]]]:
    """A started bus with a ``MemorySink``; yields ``(bus, events)``, flushed at the end."""
    sink = MemorySink(interests)
    async with Bus(**bus_options) as bus:
        bus.subscribe(sink, name="capture")
        yield bus, sink.events
        await bus.flush()


class SequentialIds:
    """Deterministic ids for ``Telemetry(ids=...)``: trace ids 1, 2, 3... and span ids 1, 2, 3...

    Called as ``ids(bits)``: 128 bits draws the next trace id, anything else the next span id.
    """

    def __init__(self, first_trace: int = 1, first_span: int = 1) -> None:
        # A W3C id is non-zero and fits its bits: 2**128 made a traceparent of 33 hex digits, and
        # a JSON-lines batch failed with OverflowError; 0 made Telemetry draw a random trace id.
        check_int(
            first_trace, f"first_trace must be an int in [1, 2**128), not {shown(first_trace)}", minimum=1
        )
        check_int(first_span, f"first_span must be an int in [1, 2**64), not {shown(first_span)}", minimum=1)
        if first_trace >= 1 << 128 or first_span >= 1 << 64:
            raise InvalidValueError(
                f"ids must fit their bits (trace 128, span 64), not {shown(first_trace)}, {shown(first_span)}"
            )
        self._lock = threading.Lock()
        self.next_trace = first_trace
        self.next_span = first_span

    def __call__(self, bits: int) -> int:
        with self._lock:
            if bits == 128:
                value = self.next_trace
                self.next_trace += 1
            else:
                value = self.next_span
                self.next_span += 1
        if value >= 1 << bits:
            raise InvalidValueError(f"SequentialIds ran out of {bits}-bit ids")
        return value


class TickingClock:
    """A deterministic clock for ``Telemetry(clock=...)``: each reading is ``step_ns`` later.

    Given alone (no ``monotonic=``), it times the spans too: a span's end is a reading of its
    own, as its start is, so events compare equal run after run.
    """

    def __init__(self, start_ns: int = CLOCK_START_NS, step_ns: int = 1_000_000) -> None:
        # A negative step made a span end before it started.
        check_int(start_ns, f"start_ns must be an int >= 0 (Unix ns), not {shown(start_ns)}")
        check_int(step_ns, f"step_ns must be an int >= 0, not {shown(step_ns)}")
        self._lock = threading.Lock()
        self.now_ns = start_ns
        self.step_ns = step_ns

    def __call__(self) -> int:
        with self._lock:
            value = self.now_ns
            self.now_ns += self.step_ns
        return value


class EventCapture:
    """A running bus with a ``MemorySink``, for sync and async tests, with deterministic telemetry.

    ``with EventCapture() as capture:`` starts the bus in a thread of its own (emitting is safe
    from any thread); ``capture.telemetry(kind, instance)`` emits onto it with ``SequentialIds``
    and a ``TickingClock``; ``capture.events`` flushes and returns the events so far (``await
    capture.flush()`` does the flushing from async code without blocking its loop). After
    the block, ``events``, ``of_type`` and ``clear`` read what the bus delivered as it closed.
    """

    def __init__(self, interests: Iterable[type[Event]] | None = None, **bus_options: Any) -> None:
        self.sink = MemorySink(interests)
        self._thread = BusThread(**bus_options)
        self.bus = self._thread.bus
        self.ids = SequentialIds()
        self.clock = TickingClock()
        self._running_thread: BusThread | None = None
        self._subscribed: set[int] = set()  # ids of the sinks on the bus: each once
        self._entered = False
        self._ended = False  # its block ended: the bus drained into the sink at its close

    def __enter__(self) -> Self:
        if self._entered:
            # Refused before touching the stack: closing it tore down the running capture (a
            # test's `with ckpt_capture:` left the fixture's capture "not running").
            raise InvalidValueError(
                "an EventCapture is entered once (the ckpt_capture fixture enters its own): "
                "use it as it is, or create a new one"
            )
        self._entered = True
        self._thread.start()
        try:
            self._thread.call(self._subscribe, self.sink, "capture")
        except BaseException:
            self._thread.close()
            raise
        self._running_thread = self._thread
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._running_thread = None
        try:
            self._thread.close()
        finally:
            self._ended = True

    def _subscribe(self, sink: Sink, name: str | None) -> None:
        if id(sink) in self._subscribed:
            return
        self.bus.subscribe(sink, name=name)
        self._subscribed.add(id(sink))

    def _running(self) -> BusThread:
        if self._ended:
            raise RuntimeError(
                "EventCapture has ended: its events are read as they were at the end of its "
                "`with` block; subscribe sinks inside the block"
            )
        if self._running_thread is None:
            raise RuntimeError("EventCapture is not running: use it as `with EventCapture() as capture:`")
        return self._running_thread

    def subscribe(self, sink: Sink, *, name: str | None = None) -> None:
        """Subscribe another sink (a span or metric sink, say) to the capture's bus; a sink
        already subscribed (the pytest plugin's sink fixtures subscribe themselves) stays once."""
        self._running().call(self._subscribe, sink, name)

    def telemetry(self, kind: Kind | str, instance: str, **options: Any) -> Telemetry:
        """A ``Telemetry`` on this bus with deterministic ids and clock (``options`` go to it)."""
        options.setdefault("ids", self.ids)
        options.setdefault("clock", self.clock)
        return Telemetry(self.bus, kind=kind, instance=instance, **options)

    def flush_sync(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Wait until every event emitted so far has reached every sink; ``TimeoutError``
        naming the sinks still holding events if that takes ``timeout`` seconds (a sink stuck
        in ``handle`` hung the test, and every read of ``events`` with it). Once the capture's
        block has ended there is nothing to wait for: its bus drained as it closed."""
        if timeout is not None:
            # Checked here, not by bus.flush in the waiting thread: "x" raised a TypeError from
            # inside threading, and -1 a TimeoutError that blamed a stuck sink.
            check_number(timeout, f"flush timeout must be a number of seconds >= 0, not {shown(timeout)}")
        if self._ended:
            return
        # Waited for from another thread: a sink blocking in a plain ``def handle`` holds the
        # bus's loop, where no timeout could fire and nothing can even be scheduled. That
        # thread ends when the sink lets go (the flush has the same timeout otherwise).
        thread = self._running()
        outcome: list[BaseException | bool] = []
        done = threading.Event()

        def flush() -> None:
            try:
                outcome.append(thread.call(self.bus.flush, timeout))
            except BaseException as exc:  # handed to the caller below
                outcome.append(exc)
            finally:
                done.set()

        threading.Thread(target=flush, name="ckpt-events-capture-flush", daemon=True).start()
        if done.wait(timeout) and outcome[0] is True:
            return
        if outcome and isinstance(outcome[0], BaseException):
            raise outcome[0]
        names = ", ".join(stats.name for stats in self.bus.stats().sinks)
        raise TimeoutError(
            f"EventCapture: the events emitted were not handled within {timeout:g} s "
            f"(a sink stuck in handle? subscribed: {names})"
        )

    async def flush(self) -> None:
        """``flush_sync`` from async code, in a worker thread so the caller's loop runs on."""
        await anyio.to_thread.run_sync(self.flush_sync)

    @property
    def events(self) -> list[Any]:
        """Every event captured so far, in order (flushed first)."""
        self.flush_sync()
        return self.sink.events

    def of_type(self, cls: type[E]) -> list[E]:
        """The captured events that are instances of ``cls``, in order (flushed first)."""
        self.flush_sync()
        return self.sink.of_type(cls)

    def clear(self) -> None:
        """Forget the events captured so far."""
        self.flush_sync()
        self.sink.clear()
