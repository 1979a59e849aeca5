"""A sink's place on the bus: its bounded buffer, its delivery task and its counters.

It owns delivery: the buffer emitters append to, the task that takes batches from it (linger,
batch interval, prompt batches), hands them to the sink (on the loop, awaited, or on the sink's
thread), and closes the sink. ``Subscription._deliver`` is the one place a sink's failure is
caught; cancellation passes through. What the sink's own code does in its hands (holding the
loop, feeding itself, failing) is watched by ``SinkWatch`` (``_sink_watch.py``). See ``_bus.py``
for what the bus guarantees a sink.
"""

from __future__ import annotations

import inspect
import math
import sys
import threading
import time
from collections import deque
from itertools import repeat, starmap
from typing import TYPE_CHECKING, Any, Final, Self

import anyio
import anyio.lowlevel
import msgspec

from ckpt_events._bus_log import logger
from ckpt_events._errors import InvalidTypeError, check_int, check_number, shown
from ckpt_events._events import EVENT_TYPES, CollectionFinished, CoordinateFinished, Event, OperationFinished
from ckpt_events._public_home import publish
from ckpt_events._sink import BlockingSink, ClosableSink, LingeringSink, Sink, WantsEvents
from ckpt_events._sink_thread import SinkThread
from ckpt_events._sink_watch import FED_ITSELF_BATCHES, SinkWatch
from ckpt_events._span_handles import QUEUED_EVENTS, QUEUED_HANDLES, RAW_SEQUENCE, OperationSpan

if TYPE_CHECKING:
    import asyncio

    from ckpt_events._bus import Bus

__all__ = ["SinkStats", "Subscription", "resolve_interests", "summed_stats"]

#: How long a blocking sink's task gathers events before handing a batch to a thread.
DEFAULT_BLOCKING_LINGER: Final = 0.05
#: The bus's default ``batch_interval``: a busy sink gets at most 100 batches a second (each a
#: task wake-up, a loop turn and, for JSON lines, a ``write()``), however the server's loop
#: turns; an idle sink's first event still goes at once.
DEFAULT_BATCH_INTERVAL: Final = 0.01
#: What closes a process's part of a trace (a finished operation, still queued as its handle;
#: a coordination; a collection). A batch holding one goes without waiting out the interval,
#: so a process killed right after a checkpoint has handed its sinks the checkpoint's events;
#: at most PROMPT_BURST such batches back to back, one more each PROMPT_REFILL seconds.
PROMPT_TYPES: Final = frozenset({OperationSpan, OperationFinished, CoordinateFinished, CollectionFinished})
PROMPT_BURST: Final = 4
PROMPT_REFILL: Final = 0.2
#: A sink working through a backlog (a flood emitted in one loop turn) takes batch after batch
#: without giving up the loop, as long as it has held it less than this (seconds): a cheap sink
#: drains a flood whole, as fast as it came; a slow one lets the loop run between its batches.
BACKLOG_HOLD: Final = 0.02


class SinkStats(msgspec.Struct, frozen=True):
    """Counters of one subscription.

    ``emitted`` counts the events offered to this sink (``delivered + failed + pending +
    dropped + abandoned``); ``failed`` counts events in batches whose ``handle`` raised, and
    ``error`` is the first thing it raised, in one line (``ValueError: boom``), or ``None``;
    ``abandoned`` counts events the bus gave up on at its close deadline (a sink stuck in
    ``handle`` or ``aclose``: the batch in its hands and what was still buffered);
    ``fed_itself`` counts batches whose ``handle`` emitted an event this sink gets itself;
    ``close_error`` is what the sink's own ``aclose()`` raised, in one line, or that it was
    still running at the close deadline (given up on), or ``None``.
    """

    name: str
    emitted: int
    delivered: int
    dropped: int
    failed: int
    failed_batches: int
    pending: int
    abandoned: int = 0
    error: str | None = None
    #: Batches whose ``handle`` emitted, through the bus, an event this same sink gets (seen
    #: on the event loop's thread: a ``blocking`` sink's thread is not watched).
    fed_itself: int = 0
    #: A sink whose ``aclose()`` failed (a file not flushed, an exporter not shut down) read as
    #: a clean sink here, said only in the log as it closed.
    close_error: str | None = None


def summed_stats(a: SinkStats, b: SinkStats, name: str) -> SinkStats:
    """``a`` and ``b`` as one row called ``name`` (``Bus.stats()``'s finished rows summed): each
    count added, the first of each one-line text kept. Over every field, so that one added to
    SinkStats is summed too: listed by hand, ``fed_itself`` was left out (summed to 0)."""
    summed: dict[str, Any] = {}
    for field in SinkStats.__struct_fields__:
        first, second = getattr(a, field), getattr(b, field)
        summed[field] = first + second if isinstance(first, int) else first if first is not None else second
    summed["name"] = name
    return SinkStats(**summed)


class _Buffer(deque[Any]):
    """A sink's bounded FIFO, with the flags ``emit`` reads inline (no method call)."""

    __slots__ = ("capacity", "consumed", "dropped", "opened", "owner", "paused", "raw", "waiting")

    def __init__(self, capacity: int, owner: Subscription | None) -> None:
        super().__init__()
        self.capacity = capacity
        self.dropped = 0
        self.waiting = False  # the delivery task sleeps until woken
        self.paused = False  # the delivery task waits out a batch interval (a finished operation ends it)
        self.owner = owner
        # The bus's one buffer taking span handles raw, starts included (``RAW_SEQUENCE`` in
        # _span_handles.py); set by its Subscription before any route holds it.
        self.raw = False
        # A number of ``RAW_SEQUENCE`` drawn as its task last took a batch (and as it was made): a
        # handle whose start number is above it has its start still in this buffer, not taken.
        self.consumed = self.opened = next(RAW_SEQUENCE)


class Subscription:
    """A sink's place on the bus. ``close()`` unsubscribes; pending events are still delivered."""

    def __init__(
        self,
        bus: Bus,
        sink: Sink,
        name: str,
        buffer_size: int,
        batch_size: int,
        linger: float | None = None,
        batch_interval: float = 0.0,
        *,
        raw_free: bool = False,
    ):
        self.bus = bus
        self.sink = sink
        self.name = name
        self.interests: frozenset[type[Event]] = resolve_interests(sink)
        self.closed = False
        self._buffer = _Buffer(buffer_size, self)
        self._buffer_size = buffer_size
        # A sink that takes span handles as they are (``_takes_span_handles``) gets the bus's one
        # raw buffer while no other subscription holds it (``raw_free``); another gets events.
        self._buffer.raw = raw_free and getattr(sink, "_takes_span_handles", False) is True
        # Finished operations and steps are queued as their span handles (see _span_handles.py),
        # turned into their events for every sink but the raw one.
        self._takes_handles = not self._buffer.raw and not self.interests.isdisjoint(QUEUED_EVENTS)
        self._batch_size = batch_size
        self._wake = anyio.Event()
        self._handled = 0  # delivered + failed
        self._in_flight = 0
        self._abandoned = 0
        # Drops seen as a batch was taken, and drops told in the log (``_say_drops``): a full
        # buffer's drops were counted in stats() alone, and a server that lost events logged nothing.
        self._drops_seen = 0
        self._drops_told = 0
        self._flush_waiters: list[tuple[int, anyio.Event]] = []
        self._done = anyio.Event()
        self._sink_closed = anyio.Event()
        self._scope: anyio.CancelScope | None = None  # made in _run, on the event loop
        self._started = False
        self._closing_sink = False  # the sink's aclose() is called once, by this task
        handle = sink.handle
        if inspect.isgeneratorfunction(handle) or inspect.isasyncgenfunction(handle):
            # Called, a generator runs none of its body: every batch was counted delivered, unseen.
            raise InvalidTypeError(
                f"a sink's handle must return (or be an async def), not yield: "
                f"{type(sink).__name__}.handle is a generator function"
            )
        _check_takes_a_batch(sink, handle)
        self._async = inspect.iscoroutinefunction(handle)
        # Its sink's conduct: loop holds, feeding itself, failures (counted, said once).
        self._watch = SinkWatch(name, is_async=self._async)
        self._blocking = _blocking_of(sink) and not self._async
        self.linger = _linger_of(sink, linger, self._blocking)
        self.batch_interval = batch_interval
        self._last_batch = -math.inf  # monotonic time the last batch was taken
        self._prompt_tokens = float(PROMPT_BURST)
        self._refilled = 0.0
        self._thread: SinkThread | None = None  # a blocking sink's daemon thread, made on first use
        self._hurry = anyio.Event()  # a pause's wake-up off asyncio
        self._hurried = False  # flush, close or a prompt batch asked to end a pause
        self._pausing = False
        self._asyncio_loop: asyncio.AbstractEventLoop | None = None  # set in _run, on asyncio
        self._pause_wake: asyncio.Future[None] | None = None

    def close(self) -> None:
        """Unsubscribe: no new events are routed here; those already buffered are delivered,
        then the sink's ``aclose()`` runs. Idempotent; safe from any thread (on a ``BusThread``'s
        bus, made on its loop and waited for, as ``subscribe`` is)."""
        hop = self.bus._from_other_thread
        if not self.closed and hop is not None and threading.get_ident() != self.bus._loop_thread:
            # On the loop, one at a time with subscribe and the bus's close: from this thread, a
            # route table rebuilt as the bus closed replaced its closed one, and events emitted
            # after the close went to a finished sink's buffer, counted nowhere (36 of 60 runs).
            try:
                hop(self.close)
                return
            except RuntimeError:  # its loop stopped meanwhile (the BusThread closed): done below
                pass
        if not self.closed:
            self.closed = True
            self.bus._unsubscribe(self)
            # The delivery task is woken on its loop: from another thread, trio refused the
            # wake-up half-way, and the sink was never closed.
            self.bus._on_loop(self._end_waits)

    def _end_waits(self) -> None:
        self._hurry_up()
        self._wake_now()

    async def aclose(self) -> None:
        """``close()``, then wait until the buffered events are delivered and the sink's own
        ``aclose()`` has run (by the bus's task: the bus is the one owner of that call).

        Bound it with the caller's deadline (``anyio.move_on_after``). Await it on the bus's
        event loop (from another thread, a running bus raises ``InvalidValueError``). From the
        sink's own ``handle`` or ``aclose()`` it unsubscribes and returns: the rest happens once
        that call returns (it waited for itself, and its sink was never closed)."""
        self.bus._check_thread("a subscription's aclose", "sub.close(), then flush on the loop")
        self.close()
        if self._started and not self._runs(anyio.get_current_task().id):
            await self._sink_closed.wait()

    def _runs(self, task_id: int) -> bool:
        """Whether ``task_id`` is this subscription's delivery task (the one in its sink's own
        ``handle`` or ``aclose()``), which cannot wait for what that task does next."""
        return self._watch.task_id == task_id

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def stats(self) -> SinkStats:
        """This subscription's counters now."""
        pending = len(self._buffer) + self._in_flight
        dropped = self._buffer.dropped
        watch = self._watch
        return SinkStats(
            name=self.name,
            emitted=self._handled + pending + dropped + self._abandoned,
            delivered=self._handled - watch.failed,
            dropped=dropped,
            failed=watch.failed,
            failed_batches=watch.failed_batches,
            pending=pending,
            abandoned=self._abandoned,
            error=watch.first_error,
            fed_itself=watch.fed_itself,
            close_error=watch.close_error,
        )

    def _abandon(self, timeout: float) -> int:
        """Give up on what is left (the bus's close deadline, ``timeout`` seconds, passed);
        returns how many."""
        if self._closing_sink:
            self._watch.close_gave_up(timeout)
        if self._scope is not None:
            self._scope.cancel()
        left = len(self._buffer) + self._in_flight
        self._buffer.clear()
        self._in_flight = 0
        self._abandoned += left
        return left

    # -- delivery task -------------------------------------------------------------------

    def _wake_now(self) -> None:
        # Called on the event loop thread only.
        self._buffer.waiting = False
        self._wake.set()

    async def _run(self) -> None:
        # Its own scope: the bus cancels a stuck sink's task alone at the close deadline,
        # never the task group (whose scope also holds the code inside `async with bus:`).
        native = anyio.lowlevel.current_token().native_token
        self._watch.task_id = anyio.get_current_task().id
        # asyncio as loaded, not imported: on trio (or to import the bus at all) it is not
        # needed, and importing it (ssl, socket, subprocess) was 18 ms of `import Bus`'s 120.
        loaded = sys.modules.get("asyncio")
        if loaded is not None and isinstance(native, loaded.AbstractEventLoop):
            self._asyncio_loop = native
        try:
            with anyio.CancelScope() as self._scope:
                await self._deliver_until_closed()
        except anyio.get_cancelled_exc_class():
            # The bus's owner was cancelled (a Ctrl-C), not this task alone (its own scope
            # takes that): the sink is still closed, shielded, within the bus's deadline (whose
            # _abandon cancels this scope); the bus's close no longer waits out that deadline
            # for a task that was gone (5 s).
            if not self._closing_sink:
                closing = anyio.CancelScope(shield=True)
                timeout = self.bus.close_timeout
                with closing as self._scope, anyio.move_on_after(timeout) as deadline:
                    await self._close_sink()
                if deadline.cancelled_caught:
                    self._watch.close_gave_up(timeout)
            raise
        finally:
            if self._thread is not None:
                self._thread.stop()
            self._sink_closed.set()
            if self.closed:
                self.bus._retire(self)

    async def _deliver_until_closed(self) -> None:
        buffer = self._buffer
        popleft = buffer.popleft
        try:
            try:
                await self._deliver_loop()
            except anyio.get_cancelled_exc_class():
                if self._scope is not None and not self._scope.cancel_called:
                    await self._rescue()
                raise
        finally:
            # Nothing more is delivered: what a thread appends still (it read the routes
            # before they changed) is dropped and counted, not left pending for ever.
            buffer.capacity = 0
            if buffer.dropped != self._drops_told:
                self._say_drops(buffer.dropped, closing=True)
            left = len(buffer)
            for _ in range(left):
                popleft()
                buffer.dropped += 1
            if left:
                # Said as what it is: these were told as a full buffer (65,536 of room, 10 held).
                logger.warning(
                    "sink %r's delivery ended with %d events still in its buffer (emitted as it "
                    "closed, or left at its close deadline); dropped, counted in bus.stats()",
                    self.name,
                    left,
                )
                self._drops_seen = self._drops_told = buffer.dropped
            self._done.set()
        await self._close_sink()

    async def _rescue(self) -> None:
        """The owner's scope was cancelled (a task group whose other task failed, a
        ``move_on_after`` around ``async with bus:``, a trio nursery cancelled to shut down):
        deliver what is buffered, and what the owner emits as it unwinds (an operation's end),
        until the bus closes this subscription, shielded, within the bus's ``close_timeout``.
        Was: the buffer was dropped at once, the last events of every sink (the failing
        operation's among them) lost and told as a full buffer. The bus's close deadline
        (``_abandon``) cancels this scope too."""
        # The batch in the sink's hands when the cancel came: its handle was cancelled (async)
        # or left to its thread; given up on, counted so, not left pending for ever.
        self._abandoned += self._in_flight
        self._in_flight = 0
        with anyio.CancelScope(shield=True) as self._scope, anyio.move_on_after(self.bus.close_timeout):
            await self._deliver_loop()
        if self._in_flight:  # its own deadline passed first, the sink stuck in handle
            logger.warning(
                "sink %r was still handling a batch %.1f s after the bus's owner was cancelled; "
                "%d events abandoned (counted in bus.stats())",
                self.name,
                self.bus.close_timeout,
                self._in_flight,
            )
            self._abandoned += self._in_flight
            self._in_flight = 0

    async def _deliver_loop(self) -> None:
        """Hand the buffer to the sink in batches until this subscription is closed and drained."""
        buffer = self._buffer
        popleft = buffer.popleft
        watch = self._watch
        lingered = False
        held_since = time.monotonic()  # when this task last gave the loop up
        while True:
            if not buffer:
                if self.closed:
                    break
                buffer.waiting = True
                if buffer or self.closed:  # an emit raced with the flag: go round again
                    buffer.waiting = False
                    continue
                watch.fed_streak = 0  # it went idle: whatever it emitted into itself came to an end
                await self._wake.wait()
                self._wake = anyio.Event()
                lingered = False
                # Let the woken emitter run on until it awaits, so batches grow.
                await anyio.lowlevel.checkpoint()
                held_since = time.monotonic()
                continue
            if self.linger and not lingered and not self.closed and len(buffer) < self._batch_size:
                lingered = True  # once per wake-up: what is left after a batch has waited already
                await self._pause(self.linger, prompt=False)
                held_since = time.monotonic()
                continue
            # Feeding itself (see FED_ITSELF_BATCHES), even its full batches wait out the interval.
            full = len(buffer) >= self._batch_size and watch.fed_streak < FED_ITSELF_BATCHES
            if self.batch_interval and not self.closed and not full:
                now = time.monotonic()
                wait = self._last_batch + self.batch_interval - now
                if wait > 0 and not self._prompt_due(buffer, now):
                    await self._pause(wait, prompt=True)
                    held_since = time.monotonic()
                    continue
                self._last_batch = now
            count = min(len(buffer), self._batch_size)
            if buffer.raw:  # before the first popleft: see RAW_SEQUENCE
                buffer.consumed = next(RAW_SEQUENCE)
            # popleft is atomic against emitters on other threads; starmap runs it in C.
            batch = list(starmap(popleft, repeat((), count)))
            # A set test over the batch's types, in C: a batch without handles costs ~20 ns
            # an event here, not a Python loop.
            if self._takes_handles and not QUEUED_HANDLES.isdisjoint(map(type, batch)):
                _finish(batch)
            self._in_flight = count
            left = len(buffer)
            dropped = buffer.dropped
            if not self._blocking:
                watch.handling = True
                buffer.waiting = True
            try:
                await self._deliver(batch)
            finally:
                # Also when cancelled: a `handling` left set would swallow the wake-ups of a rescue.
                watch.handling = False
                buffer.waiting = False
            if watch.fed_now:
                # Grown during the call by as many as it was handed: a loop that never ends.
                watch.count_fed_itself(len(buffer) - left + buffer.dropped - dropped >= count)
            else:
                watch.fed_streak = 0
            # Freed now, not as the next batch is taken: a batch interval later, or never
            # while the bus idles (up to batch_size events and their attributes kept alive
            # by a local). Side by side on a loaded server it moved the CPU per request by
            # -0.3 us, inside the noise: this is for memory, not speed.
            del batch
            self._in_flight = 0
            self._handled += count
            if buffer.dropped != self._drops_seen:
                self._say_drops(buffer.dropped)
            if self._flush_waiters:
                self._release_flushers()
            # A synchronous handle never yields by itself. The buffer refilled while the sink
            # handled its batch (a sink re-emitting what it sees, which held the loop for ever):
            # the loop runs before the next batch. A backlog left (a flood emitted in one turn):
            # once this task has held the loop BACKLOG_HOLD (a MetricSink's 16 full batches of a
            # flood held it 450-730 ms, 30-75 ms each). Yielding after every batch of a backlog
            # let an emitter of 8,192 events a turn outrun a sink taking 4,096 a turn: events
            # dropped that a sink draining the backlog whole had delivered.
            if len(buffer) > left or (buffer and time.monotonic() - held_since >= BACKLOG_HOLD):
                await anyio.lowlevel.checkpoint()
                held_since = time.monotonic()

    def _say_drops(self, dropped: int, *, closing: bool = False) -> None:
        """Say once that this sink's buffer was full (events dropped, counted in stats()), and as
        it closes how many it dropped in all if more were dropped since: checked once per batch
        taken (two ints compared), nothing on the emitters' path."""
        self._drops_seen = dropped
        if self._drops_told == 0:
            logger.warning(
                "sink %r's buffer was full (buffer_size %d): %d events dropped so far, counted in "
                "bus.stats(); said again only when it closes: give it a larger buffer_size, or let "
                "the emitting code await between bursts",
                self.name,
                self._buffer_size,
                dropped,
            )
            self._drops_told = dropped
        elif closing:
            logger.warning(
                "sink %r dropped %d events in all, its buffer full (counted in bus.stats())",
                self.name,
                dropped,
            )
            self._drops_told = dropped

    async def _pause(self, seconds: float, *, prompt: bool) -> None:
        # A linger (a bigger batch before a handoff to a worker thread: each handoff can cost
        # the event loop up to a GIL switch interval, 5 ms) or the rest of a batch interval.
        # flush() and close() end it (_hurry_up), and so does a finished operation queued
        # during an interval (``prompt``; a linger is the sink's own choice, kept).
        if not self._hurried:
            # `paused` is the emitters' flag (cleared by the first to tell), `_pausing` this task's.
            self._buffer.paused = prompt
            self._pausing = prompt
            try:
                loop = self._asyncio_loop
                if loop is not None:
                    # On asyncio a future and a timer: a cancel scope timing out (anyio's
                    # move_on_after) cost ~40-90 us of CPU more per pause, paid 100 times a
                    # second by each busy sink.
                    self._pause_wake = waker = loop.create_future()
                    timer = loop.call_later(seconds, _wake_future, waker)
                    try:
                        await waker
                    finally:
                        timer.cancel()
                        self._pause_wake = None
                else:
                    self._hurry = anyio.Event()
                    with anyio.move_on_after(seconds):
                        await self._hurry.wait()
            finally:
                self._buffer.paused = False
                self._pausing = False
        if self._hurried:
            self._hurried = False
            self._last_batch = -math.inf  # a flush's batch goes now, not after the interval

    def _prompt_due(self, buffer: _Buffer, now: float) -> bool:
        """Whether ``buffer`` holds what closes a trace's part and a prompt batch is left (then
        it takes one): such a batch does not wait out the interval."""
        return not PROMPT_TYPES.isdisjoint(map(type, buffer)) and self._take_prompt(now)

    def _prompt_now(self) -> None:
        """A finished operation was queued during a pause: end it if a prompt batch is left.
        On the event loop thread (``Bus._prompt`` schedules it there from others)."""
        if self._pausing and self._take_prompt(time.monotonic()):
            self._hurry_up()

    def _take_prompt(self, now: float) -> bool:
        tokens = min(PROMPT_BURST, self._prompt_tokens + (now - self._refilled) / PROMPT_REFILL)
        self._refilled = now
        if tokens < 1:
            self._prompt_tokens = tokens
            return False
        self._prompt_tokens = tokens - 1
        return True

    def _hurry_up(self) -> None:
        """End a pause now (flush and close do not wait for it). On the event loop thread."""
        self._hurried = True
        waker = self._pause_wake
        if waker is not None and not waker.done():
            waker.set_result(None)
        self._hurry.set()

    async def _deliver(self, batch: list[Any]) -> None:
        # The one place that catches a sink's failure: log it once, count it, go on.
        try:
            if self._async:
                await self._watch.stepped(self.sink.handle(batch), len(batch))  # type: ignore[arg-type]
                return
            if self._blocking:
                # Abandoned on cancel: a handle stuck in I/O cannot hold the bus's close past
                # its deadline, nor the interpreter's exit (a daemon thread; its batch counts
                # as abandoned).
                if self._thread is None:
                    schedule = self.bus._call_soon_threadsafe
                    assert schedule is not None  # set when the bus starts, before any delivery
                    self._thread = SinkThread(self.name, schedule)
                result = await self._thread.run(self.sink.handle, batch)
            else:
                result = self._watch.timed(self.sink.handle, batch)
            # A handle that is not a coroutine function may still return an awaitable (an
            # object with an async __call__, a plain decorator around an async def): awaited,
            # where its batch was counted delivered and the coroutine never ran.
            if inspect.iscoroutine(result):
                await self._watch.stepped(result, len(batch))
            elif result is not None and inspect.isawaitable(result):
                await result
            elif inspect.isgenerator(result) or inspect.isasyncgen(result):
                # Returned by a plain def (a decorator, a lambda) that subscribe took for a
                # handle: its body never ran, and its batches were counted delivered.
                raise InvalidTypeError(
                    f"{type(self.sink).__name__}.handle returned a generator, whose body never "
                    f"runs: return None (or be an async def)"
                )
        except anyio.get_cancelled_exc_class() as exc:
            if self._cancelled():
                raise
            self._watch.count_failure(exc, len(batch))
        except BaseException as exc:  # SystemExit too: a sink never takes its neighbours down
            self._watch.count_failure(exc, len(batch))

    def _cancelled(self) -> bool:
        """Whether this task is being cancelled, not merely handed a ``CancelledError`` by the
        sink: one out of a future someone else cancelled (a pool closed under a request), let
        through, cancelled the task group and with it the code inside ``async with bus:``."""
        if self._asyncio_loop is None:
            return True  # trio: a Cancelled comes from a cancel scope only
        import asyncio  # loaded: this loop is asyncio's (_run)

        task = asyncio.current_task()
        return task is None or task.cancelling() > 0 or anyio.current_effective_deadline() == -math.inf

    async def _close_sink(self) -> None:
        self._closing_sink = True
        if not isinstance(self.sink, ClosableSink):
            return
        try:
            closing = self.sink.aclose()
            if inspect.isawaitable(closing):  # a plain `def aclose()` is called, not awaited
                await closing
        except anyio.get_cancelled_exc_class() as exc:
            if self._cancelled():
                raise
            self._watch.close_failed(exc)
        except BaseException as exc:
            self._watch.close_failed(exc)

    def _release_flushers(self) -> None:
        keep = []
        for target, event in self._flush_waiters:
            if self._handled >= target:
                event.set()
            else:
                keep.append((target, event))
        self._flush_waiters = keep

    async def _wait_handled(self) -> None:
        target = self._handled + self._in_flight + len(self._buffer)
        self._hurry_up()
        if self._handled >= target:
            return
        if self._done.is_set():
            return
        event = anyio.Event()
        self._flush_waiters.append((target, event))
        await event.wait()


def _wake_future(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _finish(batch: list[Any]) -> None:
    """Turn the span handles in ``batch`` into their ``*Finished`` events, in place."""
    for i, item in enumerate(batch):
        if type(item) in QUEUED_HANDLES:  # the test the delivery task made over the batch
            batch[i] = item._finished()


def _check_takes_a_batch(sink: object, handle: Any) -> None:
    """``InvalidTypeError`` unless ``handle(batch)`` can be called: written without the batch,
    keyword-only, with a second required argument (or a sink's class given for an instance),
    it was subscribed, and every batch failed with a ``TypeError``."""
    try:
        signature = inspect.signature(handle)
    except (TypeError, ValueError):  # a builtin without one: its call will say
        return
    try:
        signature.bind([])
    except TypeError as exc:
        if isinstance(sink, type):
            name = sink.__name__
            raise InvalidTypeError(f"{name} is a class: subscribe an instance of it, {name}()") from None
        raise InvalidTypeError(
            f"{type(sink).__name__}.handle cannot take a batch ({exc}): a sink's handle takes the "
            f"list of events as its one positional argument, def handle(self, batch)"
        ) from None


def _linger_of(sink: object, given: float | None, blocking: bool) -> float:
    value = given if given is not None else sink.linger if isinstance(sink, LingeringSink) else None
    if value is None:
        return DEFAULT_BLOCKING_LINGER if blocking else 0.0
    return check_number(value, f"linger must be a number of seconds in [0, 60], not {shown(value)}", high=60)


def _blocking_of(sink: object) -> bool:
    """A sink's ``blocking`` (``False`` without one); anything but a bool raises ``InvalidTypeError``."""
    if not isinstance(sink, BlockingSink):
        return False
    blocking = sink.blocking
    if not isinstance(blocking, bool):
        # Read as truth, blocking="false" (a value from a config file) sent handle to a thread.
        raise InvalidTypeError(f"a sink's blocking must be True or False, not {shown(blocking)}")
    return blocking


def resolve_interests(sink: object) -> frozenset[type[Event]]:
    """The concrete event classes ``sink`` wants, from its optional ``interests``.

    No ``interests`` means every event; a base class (e.g. ``SpanEvent``) stands for its
    concrete subclasses. Anything but event classes raises ``InvalidTypeError``. The
    bus routes by this, and so does anything else that feeds sinks (``ckpt_events.sinks.replay``).
    """
    wanted = sink.interests if isinstance(sink, WantsEvents) else None
    if wanted is None:
        return frozenset(EVENT_TYPES)
    if isinstance(wanted, type):
        wanted = (wanted,)
    if isinstance(wanted, str):  # a class's name, not the class: iterating it named one letter
        raise InvalidTypeError(
            f"a sink's interests must be event classes (e.g. ckpt_events.{wanted}), not the string "
            f"{shown(wanted)}"
        )
    try:
        chosen = frozenset(wanted)
    except TypeError:
        raise InvalidTypeError(
            f"a sink's interests must be an iterable of event classes, not {shown(wanted)}"
        ) from None
    expanded: set[type[Event]] = set()
    for cls in chosen:
        if not (isinstance(cls, type) and issubclass(cls, Event)):
            raise InvalidTypeError(
                f"a sink's interests must be event classes from ckpt_events, not {shown(cls)}"
            )
        # A base class (e.g. SpanEvent) stands for all of its concrete subclasses.
        found = [t for t in EVENT_TYPES if issubclass(t, cls)]
        if not found:
            # A user's own Event subclass: the bus routes the library's event classes only, so
            # the sink was subscribed wanting nothing and got nothing, without a word.
            raise InvalidTypeError(
                f"a sink's interests must be event classes from ckpt_events, not "
                f"{cls.__module__}.{cls.__qualname__}: the bus carries only its own events "
                f"(ckpt_events.CheckpointEvent); put your own data in a span's set_attribute()"
            )
        expanded.update(found)
    return frozenset(expanded)


def _check_positive_int(what: str, value: object) -> int:
    return check_int(value, f"{what} must be a positive int, not {shown(value)}", minimum=1)


# Pickles, reprs and tracebacks name the public module (_public_home.py says why).
publish("ckpt_events", SinkStats, Subscription, resolve_interests)
