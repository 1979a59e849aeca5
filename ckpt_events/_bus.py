"""The in-process async bus: synchronous, never-blocking ``emit``; batched delivery per sink.

What the bus guarantees a sink:

* **Order.** Events reach a sink in emit order per emitting thread, in batches (lists).
* **Isolation.** Each sink has its own bounded buffer and its own delivery task. A slow or
  stalled sink drops its own overflow (counted in ``stats()``); it never slows the emitter
  or the other sinks. A sink that raises is logged once, counted, and keeps receiving.
* **Pace.** A sink kept busy gets a batch at most every ``batch_interval`` (10 ms by
  default), so its per-batch cost is paid 100 times a second, not once per request; an idle
  sink's first event, a finished operation and a flush go at once.
* **Interest.** A sink's ``interests`` (event classes) are read at subscribe time. The
  routing table is rebuilt on subscribe and unsubscribe, never per emit, and ``Telemetry``
  builds nothing for an event type no sink wants.
"""

from __future__ import annotations

import functools
import math
import os
import re
import threading
import weakref
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Final, NoReturn, Self, SupportsIndex

import anyio
import anyio.abc
import anyio.lowlevel
import msgspec

from ckpt_events._bus_contract import InterestListener
from ckpt_events._bus_log import logger
from ckpt_events._errors import InvalidTypeError, InvalidValueError, check_number, not_copyable, shown
from ckpt_events._events import EVENT_TYPES, Event
from ckpt_events._public_home import publish
from ckpt_events._sink import Sink
from ckpt_events._subscription import (
    DEFAULT_BATCH_INTERVAL,
    SinkStats,
    Subscription,
    _Buffer,
    _check_positive_int,
    summed_stats,
)
from ckpt_events._vocab import SAFE_NAME

__all__ = ["Bus", "BusStats", "Sink", "SinkStats", "Subscription"]

DEFAULT_BUFFER_SIZE: Final = 65_536
DEFAULT_BATCH_SIZE: Final = 4_096
DEFAULT_CLOSE_TIMEOUT: Final = 5.0
#: Raised by a bus left by another task than the one that entered it.
LEFT_IN_ANOTHER_TASK: Final = (
    "entered in one task and left in another, as in a pytest-asyncio async fixture (its setup "
    "and teardown run as two tasks); what was emitted was delivered and the sinks closed. Enter "
    "it in the test itself, use the ckpt_capture fixture (ckpt_events.testing.EventCapture, a "
    "bus in a thread of its own), or run async tests with anyio's pytest plugin"
)


class BusStats(msgspec.Struct, frozen=True):
    """Counters of the bus: one ``SinkStats`` per subscription, ever, and closed-bus drops."""

    sinks: tuple[SinkStats, ...]
    dropped_after_close: int

    def sink(self, name: str) -> SinkStats:
        """The stats of the subscription called ``name`` (``KeyError`` if there is none)."""
        for stats in self.sinks:
            if stats.name == name:
                return stats
        raise KeyError(name)


class Bus:
    """An in-process async event bus with one bounded buffer and delivery task per sink.

    ``async with Bus() as bus:`` starts it; leaving the block (or ``await bus.aclose()``)
    stops routing, delivers what was already emitted within ``close_timeout`` seconds, then
    closes every sink. ``emit`` works before the bus starts (events wait in the buffers),
    from any thread, and after close (the event is counted as dropped).

    ``batch_interval`` (seconds, default 0.01) is the shortest time between two batches to
    one sink: a sink kept busy gets one batch per interval rather than one per loop turn, and
    a sink that had nothing for that long gets its next event at once. A batch that holds a
    finished operation, coordination or collection does not wait (up to 4 back to back, then
    5 a second), nor does one that ``flush()`` or closing asks for. 0 delivers every turn.
    """

    def __init__(
        self,
        *,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        batch_size: int = DEFAULT_BATCH_SIZE,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
        batch_interval: float = DEFAULT_BATCH_INTERVAL,
    ) -> None:
        _check_positive_int("buffer_size", buffer_size)
        _check_positive_int("batch_size", batch_size)
        self.batch_interval = _check_interval(batch_interval)
        check_number(
            close_timeout, f"close_timeout must be a number of seconds >= 0, not {shown(close_timeout)}"
        )
        self.buffer_size = buffer_size
        self.batch_size = batch_size
        self.close_timeout = float(close_timeout)
        self._routes: dict[type, tuple[_Buffer, ...]] = {}
        self._subscriptions: list[Subscription] = []
        # Every subscription still running (live, or closed and still delivering); one that has
        # finished leaves only its final counters in `_retired`, so a sink and its buffer are
        # freed: 100k subscribe/unsubscribe cycles kept every sink (+754 MiB).
        self._history: dict[Subscription, None] = {}
        # id(sink) -> its subscription in `_history`: a sink on the bus twice got every event
        # twice, its handle re-entered and called after its own aclose().
        self._sink_subs: dict[int, Subscription] = {}
        self._retired: list[SinkStats] = []
        self._listeners: weakref.WeakSet[InterestListener] = weakref.WeakSet()
        self._tg: anyio.abc.TaskGroup | None = None
        self._host_task: int | None = None  # the task that entered the bus, which leaves it
        self._loop_thread: int | None = None
        self._call_soon_threadsafe: Callable[[Callable[[], object]], object] | None = None
        # The running loop's token, for a caller on another thread (replay's flush) to reach it.
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self._closed = False
        self._closing = False
        self._closed_event = anyio.Event()
        self._dropped_after_close = 0
        # Where every event goes once the bus is closed: a buffer that takes nothing and
        # counts it. An emitter (a span handle on another thread) that read the routes
        # before they changed still lands somewhere counted, and a Telemetry stays live:
        # with an empty table its spans were no-ops, counted nowhere.
        self._after_close = _Buffer(0, None)
        self._names: set[str] = set()
        self._suffixes: dict[str, int] = {}  # the last "-n" given per base name
        self._warned_classes: set[type] = set()  # emitted, not carried, and said so (_not_carried)
        # The parent's pid in a process forked while this bus ran there (see _forked_child).
        self._forked_from: int | None = None
        # Set by BusThread while it runs this bus: runs a call on the loop from another thread.
        self._from_other_thread: Callable[[Callable[[], Any]], Any] | None = None
        # Run by aclose() once every sink is closed, in the order added (``_on_close``): what a
        # configure() of this bus built beyond its sinks (a meter provider, a scrape endpoint).
        self._close_hooks: dict[object, Callable[[], Awaitable[None]]] = {}

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._tg is not None or self._closed:
            raise InvalidValueError("a Bus can be entered once; create a new one")
        self._loop_thread = threading.get_ident()
        self._call_soon_threadsafe = _threadsafe_scheduler()
        self._token = anyio.lowlevel.current_token()
        _watch_forks(self)
        self._host_task = anyio.get_current_task().id
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        for sub in self._subscriptions:
            self._start(sub)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        await self.aclose()
        # The task group is exited here only, by the task that entered it: aclose() may run
        # in another task or inside the caller's cancel scope, where exiting it is an error.
        tg = self._tg
        self._tg = None
        if tg is None:
            return None
        if anyio.get_current_task().id != self._host_task:
            # A task group is left by the task that entered it, and by no other (anyio raised
            # "Attempted to exit cancel scope in a different task", twice, in a pytest-asyncio
            # async fixture): its tasks ended in aclose() above, a straggler is cancelled here.
            tg.cancel_scope.cancel()
            if exc_type is None:
                raise InvalidValueError(f"a Bus was {LEFT_IN_ANOTHER_TASK}")
            return None  # the caller's own exception comes out as it was raised
        await tg.__aexit__(None, None, None)
        return None

    async def aclose(self) -> None:
        """Stop routing, deliver what was emitted, close every sink: all within ``close_timeout``.

        A sink still busy at the deadline (stuck in ``handle`` or in its own ``aclose()``)
        is given up on: logged once by name, and what it held counted as ``abandoned`` in
        ``stats()``. Safe from any task of the bus's event loop and inside the caller's cancel
        scopes (from another thread, a running bus raises ``InvalidValueError``); idempotent.
        Events emitted afterwards are counted in ``dropped_after_close``. A bus never entered
        (no ``async with``) delivers what it holds and closes its sinks here all the same.
        Inside a sink's own ``handle`` (or ``aclose()``) it starts the close in the bus's task
        (or leaves one under way going) and returns, so that the sink's call can end; leaving
        ``async with`` waits for it.
        """
        if self._forked_from is not None:
            return  # the bus runs, and is closed, in the parent: nothing of it runs here
        self._check_thread("aclose", "anyio.from_thread.run(bus.aclose)")
        # Waited for inside a sink's own call, the close waited for that call (its whole
        # deadline), then gave it up as "still busy" and abandoned its batch.
        in_a_sink = self._tg is not None and self._in_a_sink()
        if self._closing:
            if not in_a_sink:
                await self._closed_event.wait()
            return
        self._closing = True
        self._closed = True
        if in_a_sink:
            assert self._tg is not None
            self._tg.start_soon(self._close, name="ckpt_events bus close")
            return
        await self._close()

    def _in_a_sink(self) -> bool:
        """Whether the caller is a sink's own ``handle`` or ``aclose()`` (its delivery task)."""
        current = anyio.get_current_task().id
        return any(sub._runs(current) for sub in self._history)

    async def _close(self) -> None:
        """What ``aclose()`` does once: stop routing, deliver, close the sinks, run the hooks."""
        try:
            for sub in list(self._subscriptions):
                sub.close()
            self._set_routes(dict.fromkeys(self._routes, (self._after_close,)))
            if self._tg is None:
                await self._close_never_entered()
            else:
                await self._wait_for_sinks()
            await self._run_close_hooks()
        finally:
            _RUNNING.discard(self)
            self._closed_event.set()

    def _on_close(self, owner: object, hook: Callable[[], Awaitable[None]]) -> None:
        """Have ``aclose()`` await ``hook()`` once every sink is closed, unless ``_drop_close_hook(owner)``
        comes first. Held strongly: a ``configure(bus)`` whose result was not kept is closed too."""
        self._close_hooks[owner] = hook

    def _drop_close_hook(self, owner: object) -> None:
        self._close_hooks.pop(owner, None)

    async def _run_close_hooks(self) -> None:
        """The hooks, in the order added, after the sinks' buffers were drained and the sinks
        closed (so the last records reach a meter provider before it exports and shuts down).
        Shielded: each is bounded by its owner's own deadline (``Configured.close_timeout``)."""
        with anyio.CancelScope(shield=True):
            while self._close_hooks:
                owner = next(iter(self._close_hooks))
                await self._close_hooks.pop(owner)()

    async def _close_never_entered(self) -> None:
        """``aclose()`` of a bus never entered: its subscriptions still deliver what was emitted
        and close their sinks, as ``_close_unstarted`` does (they held their events pending for
        good, and no sink was closed)."""
        await self._close_unstarted(list(self._history), self.close_timeout, "bus closed")

    async def _close_unstarted(self, subs: list[Subscription], timeout: float, what: str) -> None:
        """Close ``subs`` of a bus never entered, deliver what they hold and close their sinks, in a
        task group of its own, within ``timeout`` (the rest abandoned, counted and said with
        ``what``): the bus's own close, and ``Configured.aclose()`` of its sinks before the bus ever
        started (it closed nothing: the export child ran on, the JSON-lines file open, unwritten)."""
        for sub in subs:
            sub.close()
        loop_thread = self._loop_thread
        call_soon = self._call_soon_threadsafe
        self._loop_thread = threading.get_ident()
        self._call_soon_threadsafe = _threadsafe_scheduler()
        # Shielded (bounded by _wait_for_sinks's deadline): in a caller's cancelled scope its
        # delivery tasks were cancelled as they started, and an async sink's events abandoned.
        try:
            with anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    try:
                        for sub in subs:
                            if not sub._started:
                                self._start(sub)
                        await self._wait_for_sinks(timeout, what)
                    finally:
                        self._tg = None
                        tg.cancel_scope.cancel()  # a task given up on at the deadline is not waited for
        finally:
            # Not entered still: a sub.close() from another thread runs there and then, not on
            # this loop (perhaps gone by then, and the call with it).
            self._loop_thread = loop_thread
            self._call_soon_threadsafe = call_soon

    async def _wait_for_sinks(self, timeout: float | None = None, what: str = "bus closed") -> None:
        """Wait for every started subscription to finish, within ``timeout`` (the bus's
        ``close_timeout`` by default); give up on the rest."""
        if timeout is None:
            timeout = self.close_timeout
        # Every subscription still running, also one unsubscribed earlier and still
        # delivering or closing its sink: the deadline covers them all (it covered only those
        # subscribed at close, and a sink closing for 20 s held a 1 s close for 20 s).
        started = [sub for sub in self._history if sub._started]
        with anyio.CancelScope(shield=True), anyio.move_on_after(timeout):
            for sub in started:
                await sub._sink_closed.wait()
        stuck = [sub for sub in started if not sub._sink_closed.is_set()]
        if stuck:
            abandoned = sum(sub._abandon(timeout) for sub in stuck)
            logger.warning(
                "%s with %s still busy after %.1f s; %d events abandoned (counted in bus.stats())",
                what,
                ", ".join(repr(sub.name) for sub in stuck),
                timeout,
                abandoned,
            )

    # -- subscriptions -------------------------------------------------------------------

    def subscribe(
        self,
        sink: Sink,
        *,
        name: str | None = None,
        buffer_size: int | None = None,
        batch_size: int | None = None,
        linger: float | None = None,
        batch_interval: float | None = None,
    ) -> Subscription:
        """Subscribe ``sink``; returns its ``Subscription`` (``sub.close()`` unsubscribes).

        A sink object is subscribed once at a time (again: ``InvalidValueError`` naming its
        subscription, until that one has finished). Call it from the event loop's thread
        (another thread's call to a running bus raises ``InvalidValueError`` and changes
        nothing), or from any thread when a ``BusThread`` runs the bus. ``name`` labels its
        stats, log lines and metrics: 1-128 characters of ``[A-Za-z0-9._-]``, starting with a
        letter or digit (else ``InvalidTypeError`` or ``InvalidValueError``, and nothing
        subscribed); by default the sink's class name, made to fit the rule (``_MySink`` is
        ``MySink``). A name a live subscription holds already is made unique with a suffix (``alerts-2``);
        ``sub.name`` is the name it got. ``buffer_size``, ``batch_size``,
        ``batch_interval`` and ``linger`` override the bus's defaults (and the sink's
        ``linger``) for this sink.
        """
        if self._closed:
            raise InvalidValueError("this bus is closed; subscribe to a new Bus")
        hop = self._from_other_thread
        if hop is not None and threading.get_ident() != self._loop_thread:
            # A BusThread's bus: subscribed on its loop, waited for here (sinks.configure(bus)
            # from synchronous code); any other running bus refuses below.
            subscribed: Subscription = hop(
                functools.partial(
                    self.subscribe,
                    sink,
                    name=name,
                    buffer_size=buffer_size,
                    batch_size=batch_size,
                    linger=linger,
                    batch_interval=batch_interval,
                )
            )
            return subscribed
        # Its delivery task starts in the bus's task group, which only that loop may touch.
        self._check_thread("subscribe", "anyio.from_thread.run_sync(bus.subscribe, sink)")
        if name is not None:
            _check_name(name)
        existing = self._sink_subs.get(id(sink))
        if existing is not None:
            raise InvalidValueError(
                f"this {type(sink).__name__} is already subscribed as {shown(existing.name)}: one "
                f"subscription per sink object (its handle is never re-entered, its aclose() "
                f"called once); subscribe it again once that one has finished"
            )
        handle = getattr(sink, "handle", None)
        if not callable(handle):
            raise InvalidTypeError(f"a sink needs a handle(batch) method; {type(sink).__name__} has none")
        buffer_size = (
            self.buffer_size if buffer_size is None else _check_positive_int("buffer_size", buffer_size)
        )
        batch_size = self.batch_size if batch_size is None else _check_positive_int("batch_size", batch_size)
        batch_interval = self.batch_interval if batch_interval is None else _check_interval(batch_interval)
        base = name or _default_name(sink)
        suffix = self._suffixes.get(base)
        unique = self._unique_name(base)
        try:
            # One raw buffer per bus: a handle's ``_wire`` tells one consumer its start from its end.
            # Looked for only by a sink that could take it: a scan per subscribe made 3,000
            # subscriptions quadratic (4.5 M steps, half their time).
            raw_free = getattr(sink, "_takes_span_handles", False) is True and not any(
                s._buffer.raw for s in self._subscriptions
            )
            sub = Subscription(
                self, sink, unique, buffer_size, batch_size, linger, batch_interval, raw_free=raw_free
            )
        except BaseException:
            # Refused (bad interests, linger, blocking): the name is given back, so the sink
            # corrected and subscribed again is called what was asked (it became "name-2").
            self._names.discard(unique)
            if suffix is None:
                self._suffixes.pop(base, None)
            else:
                self._suffixes[base] = suffix
            raise
        self._subscriptions.append(sub)
        self._history[sub] = None
        self._sink_subs[id(sink)] = sub
        self._add_routes(sub)
        if self._tg is not None:
            self._start(sub)
        return sub

    def _unique_name(self, base: str) -> str:
        # Counting on from the last suffix given for ``base``: from 1 each time, the 4,000th
        # sink of one class tried 3,999 names first.
        name, n = base, self._suffixes.get(base, 1)
        while name in self._names:
            n += 1
            suffix = f"-{n}"
            # The base cut to make room: a 128-character name's "-2" made one of 130, past the rule.
            name = f"{base[: MAX_NAME - len(suffix)]}{suffix}"
        self._suffixes[base] = n
        self._names.add(name)
        return name

    def _start(self, sub: Subscription) -> None:
        assert self._tg is not None
        sub._started = True
        self._tg.start_soon(sub._run, name=f"ckpt_events sink {sub.name}")

    def _unsubscribe(self, sub: Subscription) -> None:
        if sub in self._subscriptions:
            self._subscriptions.remove(sub)
            if not self._closed:
                self._rebuild_routes()

    def _add_routes(self, sub: Subscription) -> None:
        # Incremental: the new buffer goes after the others of each class it wants (the order
        # of subscription), without walking every subscription again; rebuilding the table
        # per subscribe made 4,000 subscriptions take 7.1 s.
        routes = dict(self._routes)
        for cls in sub.interests:
            routes[cls] = (*routes.get(cls, ()), sub._buffer)
        self._set_routes(routes)

    def _rebuild_routes(self) -> None:
        routes: dict[type, list[_Buffer]] = {}
        for sub in self._subscriptions:
            for cls in sub.interests:
                routes.setdefault(cls, []).append(sub._buffer)
        self._set_routes({cls: tuple(buffers) for cls, buffers in routes.items()})

    def _set_routes(self, routes: dict[type, tuple[_Buffer, ...]]) -> None:
        # Swap the whole table: an emit on another thread sees the old one or the new one.
        self._routes = routes
        for listener in list(self._listeners):
            listener._interest_changed()

    def _add_listener(self, listener: InterestListener) -> None:
        """Register an emitter (``Telemetry``) to be told when interests change."""
        self._listeners.add(listener)

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        # Was a TypeError about a weakref (pickle) or _Buffer.__init__ (deepcopy), and
        # copy.copy gave a second Bus sharing this one's buffers and sinks.
        not_copyable(
            self,
            "it delivers to the sinks of the process and event loop that made it; "
            "create a Bus in each process (a worker process makes its own)",
        )

    def wants(self, event_type: type[Event]) -> bool:
        """Whether any subscribed sink wants events of ``event_type``."""
        return event_type in self._routes

    # -- the hot path ----------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        """Offer ``event`` to every sink that wants its type. Never blocks, never raises.

        Safe from any thread. A full buffer drops the event for that sink only (counted).
        """
        try:
            buffers = self._routes[event.__class__]
        except KeyError:
            if self._closed:
                self._dropped_after_close += 1
            elif event.__class__ not in CARRIED:
                self._not_carried(event)
            return
        # An index loop, not `for buffer in buffers`: a tuple iterator is an allocation per
        # emit, and the bus adds none beyond the event (the allocator-hook test checks it).
        i = 0
        n = len(buffers)
        while i < n:
            buffer = buffers[i]
            if len(buffer) < buffer.capacity:
                buffer.append(event)
                if buffer.waiting:
                    self._wake(buffer)
            else:
                buffer.dropped += 1
            i += 1

    def _not_carried(self, event: object) -> None:
        """``emit`` was handed what no sink can ever want (a user's own ``Event`` subclass, not
        an event at all): said once per class, where it vanished without a word."""
        cls = event.__class__
        if cls in self._warned_classes or len(self._warned_classes) >= WARNED_CLASSES:
            return
        self._warned_classes.add(cls)
        logger.warning(
            "bus.emit was given a %s.%s, not one of ckpt_events' event classes: no sink gets it "
            "(the bus carries ckpt_events.CheckpointEvent only; put your own data in a span's "
            "set_attribute()); said once per class",
            cls.__module__,
            cls.__qualname__,
        )

    def _wake(self, buffer: _Buffer) -> None:
        buffer.waiting = False
        sub = buffer.owner
        if sub is None:  # only _forked_child's buffer has no owner and waits: its first event
            self._first_event_after_fork(buffer)
            return
        assert sub is not None  # the closed bus's buffer has no owner either, and it never waits
        if threading.get_ident() == self._loop_thread:
            watch = sub._watch
            if watch.handling:  # its task is in handle, not waiting: was this emit handle's own?
                watch.emitted_into()
                return
            sub._wake.set()
        elif self._call_soon_threadsafe is not None:
            try:
                self._call_soon_threadsafe(sub._wake_now)
            except RuntimeError:  # the loop has closed; the events stay counted as pending
                pass

    def _off_its_loop(self) -> bool:
        """Whether the bus runs on an event loop of another thread than the caller's."""
        return self._token is not None and threading.get_ident() != self._loop_thread

    def _flush_from_thread(self, timeout: float | None = None) -> bool:
        """``flush`` for a caller on another thread than the bus's loop (``_off_its_loop``: a
        sink's timer thread, a replay running on a loop of its own): run on the bus's loop,
        waited for on this thread, which it blocks."""
        import anyio.from_thread  # here: only these callers need it, not every import of the bus

        assert self._token is not None, "the bus has not started"
        return bool(anyio.from_thread.run(self.flush, timeout, token=self._token))

    def _check_thread(self, call: str, instead: str) -> None:
        """``InvalidValueError`` if the bus is running on another thread's event loop than this
        one: its events and task group belong to that loop (awaited from another loop, a flush's
        event was set from the bus's loop, and on trio that killed the owner's task group)."""
        if self._tg is not None and threading.get_ident() != self._loop_thread:
            # A thread of the user's own (not AnyIO's) has no loop to go back to: without the
            # token, the call advised raised anyio's NoEventLoopError.
            if instead.startswith("anyio.from_thread."):
                instead = (
                    f"from an AnyIO worker thread: {instead}; from a thread of your own, pass the "
                    f"loop's token: {instead[:-1]}, token=token), token = "
                    "anyio.lowlevel.current_token() read on the loop"
                )
            else:
                instead = f"from a worker thread: {instead}"
            raise InvalidValueError(
                f"{call} on the event loop's thread running this bus, not from another thread ({instead})"
            )

    def _on_loop(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` now on the loop's thread (or before the bus starts), else soon on the loop."""
        if self._call_soon_threadsafe is None or threading.get_ident() == self._loop_thread:
            callback()
        else:
            try:
                self._call_soon_threadsafe(callback)
            except RuntimeError:  # the loop has closed
                pass

    def _emit_closing(self, event: Event) -> None:
        """``emit`` for what closes a process's part of a trace (a finished coordination or
        collection): a buffer whose task waits out a batch interval is told, as a finished
        operation's handle tells it (``OperationSpan.__exit__``); ``emit`` itself reads no flag."""
        self.emit(event)
        for buffer in self._routes.get(event.__class__, ()):
            if buffer.paused:
                self._prompt(buffer)

    def _prompt(self, buffer: _Buffer) -> None:
        """A finished operation was queued while ``buffer``'s task waits out a pause."""
        buffer.paused = False  # told once per pause
        sub = buffer.owner
        assert sub is not None
        if threading.get_ident() == self._loop_thread:
            sub._prompt_now()
        elif self._call_soon_threadsafe is not None:
            try:
                self._call_soon_threadsafe(sub._prompt_now)
            except RuntimeError:  # the loop has closed
                pass

    # -- a process forked while the bus runs ---------------------------------------------

    def _forked_child(self, parent: int) -> None:
        """This process was forked while the bus ran in ``parent`` (gunicorn ``--preload``, a
        ``fork`` multiprocessing pool): its loop, delivery tasks and sink threads stayed there.

        Events emitted here were kept pending for ever, unsaid, and ``flush`` blamed the
        thread. Now the bus is closed here: every event goes to one buffer that takes the
        first, says so in one warning (``_first_event_after_fork``; none for a child that
        never emits) and from then on counts each in ``dropped_after_close``. The parent's
        bus is untouched; what its buffers held at the fork is the parent's to deliver.
        """
        self._forked_from = parent
        self._closed = True
        self._closing = True
        self._tg = None
        self._token = None
        self._loop_thread = None
        self._call_soon_threadsafe = None
        self._from_other_thread = None  # the BusThread's loop is the parent's: a call there never returns
        first = _Buffer(1, None)
        first.waiting = True
        self._after_close = first
        self._set_routes(dict.fromkeys(CARRIED, (first,)))

    def _first_event_after_fork(self, buffer: _Buffer) -> None:
        buffer.dropped += len(buffer)
        buffer.clear()
        buffer.capacity = 0  # every later event is counted dropped in emit, with nothing said
        logger.warning(
            "this process (pid %d) was forked from pid %d while a ckpt_events Bus ran there; the "
            "bus's loop and sinks stay in that process, so events emitted here reach no sink "
            "(counted in bus.stats().dropped_after_close): create the Bus and configure() its sinks "
            "in each process after the fork (instrument() does so in each worker's lifespan)",
            os.getpid(),
            self._forked_from,
        )

    # -- flush and stats -------------------------------------------------------------------

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every event emitted before this call has been handled by every sink.

        Returns ``False`` if ``timeout`` seconds passed first (a stalled sink); the events
        are not lost, they stay pending. Await it on the bus's event loop (from another
        thread, a running bus raises ``InvalidValueError``), and not inside a sink's own
        ``handle`` (``InvalidValueError``: its batch is handled once that call returns). A sink
        that hands events on (an ``ExportProcess`` writing them to its child) has handled them
        once handed on: to wait for the child's sinks, await its ``force_flush()`` after this.
        """
        if timeout is not None:
            check_number(
                timeout, f"flush timeout must be a number of seconds >= 0 or None, not {shown(timeout)}"
            )
        if self._forked_from is not None:
            return True  # nothing emitted here waits: it was counted dropped (_forked_child)
        self._check_thread("flush", "anyio.from_thread.run(bus.flush)")
        subs = [s for s in self._history if s._started and not s._done.is_set()]
        current = anyio.get_current_task().id
        for sub in subs:
            if sub._runs(current):
                # It waited for itself: for ever, or its whole timeout and then False, a stall of
                # its own; the sink stalled meanwhile, its buffer filling up.
                raise InvalidValueError(
                    f"bus.flush() inside sink {sub.name!r}'s own handle waits for that handle to "
                    f"return: flush from the code that emits, not from a sink"
                )
        with anyio.move_on_after(math.inf if timeout is None else timeout):
            for sub in subs:
                await sub._wait_handled()
            return True
        return False

    def _retire(self, sub: Subscription) -> None:
        """``sub`` has finished (closed, delivered, its sink closed): keep its counters only."""
        if sub not in self._history:
            return
        del self._history[sub]
        if self._sink_subs.get(id(sub.sink)) is sub:
            del self._sink_subs[id(sub.sink)]
        self._names.discard(sub.name)  # its name may be given again (stats keep the old row)
        retired = self._retired
        retired.append(sub.stats())
        while len(retired) > RETIRED_ROWS:  # stats() stays bounded and no event goes uncounted
            _fold_oldest(retired)

    def stats(self) -> BusStats:
        """Counters for every subscription this bus has had, and closed-bus drops.

        Finished subscriptions come first, in the order they finished; past ``RETIRED_ROWS``
        of them the oldest is summed into the next finished row of its name, else into one row
        named ``EARLIER_SUBSCRIPTIONS``. Safe to call from any thread.
        """
        # Copied in one C call each (the GIL held throughout), so a reader on another thread (a
        # Prometheus scrape) never iterates the dict while the loop adds or retires a subscription.
        retired, live = tuple(self._retired), tuple(self._history)
        return BusStats(
            sinks=(*retired, *(sub.stats() for sub in live)),
            dropped_after_close=self._dropped_after_close + self._after_close.dropped,
        )


#: The longest subscription name (``SAFE_NAME``), a suffix made unique included.
MAX_NAME: Final = 128
_UNSAFE_RUN: Final = re.compile(r"[^A-Za-z0-9._-]+")
#: The classes ``emit`` routes (the rest reach no sink, however it subscribed).
CARRIED: Final = frozenset(EVENT_TYPES)
#: How many classes ``emit`` says once it does not carry; past that it says nothing more.
WARNED_CLASSES: Final = 64
#: Finished subscriptions whose counters ``Bus.stats()`` lists one by one.
RETIRED_ROWS: Final = 1024
#: The name of the row that sums finished subscriptions beyond ``RETIRED_ROWS``.
EARLIER_SUBSCRIPTIONS: Final = "(earlier subscriptions)"


def _fold_oldest(retired: list[SinkStats]) -> None:
    """Sum the oldest finished row into the next one of its name, else into the summed row: a
    name's sum is its series on the Prometheus page, which fell when a row left it (a counter
    reset to increase(), so CheckpointTelemetryLost paged every loss the name still held)."""
    first = 1 if retired[0].name == EARLIER_SUBSCRIPTIONS else 0
    oldest = retired.pop(first)
    later = next((i for i in range(first, len(retired)) if retired[i].name == oldest.name), None)
    if later is not None:
        retired[later] = summed_stats(oldest, retired[later], oldest.name)
    elif first:
        retired[0] = summed_stats(retired[0], oldest, EARLIER_SUBSCRIPTIONS)
    else:
        retired.insert(0, msgspec.structs.replace(oldest, name=EARLIER_SUBSCRIPTIONS))


def _check_name(name: object) -> None:
    # A name goes into stats, log lines and metric labels: no line breaks, no markup, bounded.
    rule = "a subscription's name is 1-128 characters of [A-Za-z0-9._-], starting with a letter or digit"
    if not isinstance(name, str):
        raise InvalidTypeError(f"{rule}; not {shown(name)}")
    if SAFE_NAME.fullmatch(name) is None:
        raise InvalidValueError(f"{rule}; not {shown(name)}")


def _default_name(sink: object) -> str:
    """The sink's class name as a subscription name: kept when it fits the rule, else its runs
    of other characters made ``-``, its leading ones dropped and cut to 128 (``_MySink`` is
    ``MySink``); ``sink`` if nothing is left. The rule held for given names only, and a class
    name went into stats and log lines as it was (``_MySink``, ``Sinké``, 300 characters)."""
    # A class subscribed as it is (its handle a classmethod) was named for its metaclass, "type".
    raw = sink.__name__ if isinstance(sink, type) else type(sink).__name__
    if SAFE_NAME.fullmatch(raw) is not None:
        return raw
    cleaned = _UNSAFE_RUN.sub("-", raw).lstrip("._-")[:MAX_NAME].rstrip("-")
    return cleaned or "sink"


def _check_interval(value: object) -> float:
    return check_number(
        value, f"batch_interval must be a number of seconds in [0, 1], not {shown(value)}", high=1
    )


#: Every bus entered in this process and not yet closed, told when the process forks.
_RUNNING: Final[weakref.WeakSet[Bus]] = weakref.WeakSet()
_fork_hook: list[bool] = []  # registered (once, at the first bus entered, not at import)


def _watch_forks(bus: Bus) -> None:
    _RUNNING.add(bus)
    if not _fork_hook and hasattr(os, "register_at_fork"):
        _fork_hook.append(True)
        os.register_at_fork(after_in_child=_after_fork_in_child)


def _after_fork_in_child() -> None:
    parent = os.getppid()
    for bus in list(_RUNNING):
        if not bus._closed:
            bus._forked_child(parent)
    _RUNNING.clear()


def _threadsafe_scheduler() -> Callable[[Callable[[], object]], object]:
    """How another thread schedules a callback on the current event loop."""
    native = anyio.lowlevel.current_token().native_token
    call_soon = getattr(native, "call_soon_threadsafe", None)  # asyncio's loop
    if call_soon is not None:
        return call_soon  # type: ignore[no-any-return]
    return native.run_sync_soon  # type: ignore[attr-defined,no-any-return]  # trio's token


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events", Bus, BusStats)
