"""How a user's sink behaves in the bus's hands, watched and said once: ``SinkWatch``.

It owns what the bus notices about a sink's own code, not about its buffer: a ``handle`` that
holds the event loop (a sync call, or one step of an async handle between two awaits, timed as
asyncio's debug mode times a callback), a sink that feeds itself (its ``handle`` emits events
the same sink gets, so its task never rests), a ``handle`` that raised (counted, the first
logged), and an ``aclose()`` that raised or was given up on. Each is counted for ``SinkStats``
and logged once per subscription.

The delivery task (``_subscription.py``) calls it around each batch; it never catches anything
itself: ``Subscription._deliver`` is the one boundary where a sink's failure is caught.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Final

import anyio

from ckpt_events._bus_log import logger
from ckpt_events._logs import one_line

__all__ = ["FED_ITSELF_BATCHES", "SinkWatch"]

#: How long one call of a sync ``handle`` (not ``blocking``) may hold the event loop before it is
#: said, once per subscription (asyncio's own slow-callback threshold, in its debug mode): a sink
#: sleeping 0.2 s per batch took a FastAPI app's p99 from 1.4 ms to 204 ms, without a word.
HELD_LOOP_WARN: Final = 0.1
#: A sink whose handle emitted into its own buffer at least as many events as it was handed, in
#: this many batches in a row over at least FED_ITSELF_SECONDS, is said once: one that emits an event
#: per event it gets ran for ever, its task never idle (1.7-6 % of a core), without a word.
FED_ITSELF_BATCHES: Final = 50
FED_ITSELF_SECONDS: Final = 1.0
# While it feeds itself so, even its full batches wait out the batch interval (a bus with
# batch_interval=0 asked for none): nothing it emits is lost to that, and a loop of 5,000 events
# went from 85 % of a core (full batches back to back, the server's loop starved) to ~20 %.


class SinkWatch:
    """What one subscription's sink did with the loop, its own events and its failures.

    Plain attributes, read and set by the delivery task inline (one batch at a time, on the
    event loop's thread); the methods count and say what was seen.
    """

    __slots__ = (
        "_async",
        "_fed_since",
        "_fed_told",
        "_held_told",
        "close_error",
        "failed",
        "failed_batches",
        "fed_itself",
        "fed_now",
        "fed_streak",
        "first_error",
        "handling",
        "name",
        "task_id",
    )

    def __init__(self, name: str, *, is_async: bool) -> None:
        self.name = name
        self._async = is_async
        self.failed = 0  # events in batches whose handle raised
        self.failed_batches = 0
        self.first_error: str | None = None  # logged once, kept for stats()
        self.close_error: str | None = None  # its aclose() raised or was given up on
        self._held_told = False  # a handle held the loop past HELD_LOOP_WARN, said once
        # Whether handle emits into this sink's own buffer: while it runs (``handling``), the
        # buffer's `waiting` flag is set, so the first emit into it calls Bus._wake (nothing
        # added to emit itself), which tells the handle's own emit from others' by thread and
        # task (``emitted_into``).
        self.handling = False
        self.fed_now = False  # this batch's handle emitted into its own buffer
        self.fed_itself = 0
        self.fed_streak = 0  # batches in a row that fed themselves, the buffer never empty
        self._fed_since = 0.0
        self._fed_told = False
        self.task_id: int | None = None  # the delivery task's (anyio's task id), set as it starts

    # -- holding the loop ------------------------------------------------------------------

    def timed(self, handle: Callable[[list[Any]], object], batch: list[Any]) -> object:
        """Call a sync ``handle`` on the loop. Two clock reads a batch (at most ~100 a second):
        a handle that holds the loop is said once, where it stalled every request of the server
        without a word."""
        started = time.perf_counter()
        result = handle(batch)
        held = time.perf_counter() - started
        if held > HELD_LOOP_WARN and not self._held_told:
            self._say_held(held, len(batch))
        return result

    @types.coroutine
    def stepped(self, coro: Coroutine[Any, Any, Any], events: int) -> Generator[Any, Any, None]:
        """Await ``coro`` (an async handle's), timing each of its steps: each resumption holds the
        loop until the coroutine's next suspension, as asyncio's debug mode times each callback.
        Its awaits are not counted (a handle awaiting for seconds is fine); one step past
        HELD_LOOP_WARN (a ``time.sleep``, CPU work without an await) is said once. Two clock
        reads a step: ~0.2 us (measured), where a step awaiting ``asyncio.sleep(0)`` costs ~1.9 us."""
        send = coro.send
        value: Any = None
        error: BaseException | None = None
        while True:
            started = time.perf_counter()
            try:
                suspended = send(value) if error is None else coro.throw(error)
            except StopIteration:
                return
            finally:
                held = time.perf_counter() - started
                if held > HELD_LOOP_WARN and not self._held_told:
                    self._say_held(held, events, between_awaits=True)
            error = None
            try:
                value = yield suspended  # to the task running this one, as its own await would
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation, thrown into the handle where it waits
                error = exc
                value = None

    def _say_held(self, held: float, events: int, *, between_awaits: bool = False) -> None:
        """Say once that ``handle`` held the event loop (nothing else ran meanwhile)."""
        self._held_told = True
        if between_awaits:
            logger.warning(
                "sink %r held the event loop for %.0f ms between two awaits of its async "
                "handle() (%d events): nothing else on the loop ran meanwhile; run its blocking "
                "or CPU-bound part in a thread (await anyio.to_thread.run_sync(...)), or make "
                "it a sync handle with blocking = True; said once",
                self.name,
                held * 1000,
                events,
            )
            return
        logger.warning(
            "sink %r held the event loop for %.0f ms in one handle() call (%d events): nothing "
            "else on the loop ran meanwhile; if its handle waits on I/O, give the sink "
            "blocking = True (it then runs in a worker thread), else make handle an async def "
            "that awaits; said once",
            self.name,
            held * 1000,
            events,
        )

    # -- feeding itself --------------------------------------------------------------------

    def emitted_into(self) -> None:
        """``Bus._wake`` on the loop's thread, the first emit into this buffer while ``handle``
        runs: the handle's own if a sync handle runs (nothing else runs on the loop then) or the
        emit comes from the delivery task (an async handle; another task's emit is not its own)."""
        if not self._async or anyio.get_current_task().id == self.task_id:
            self.fed_now = True

    def count_fed_itself(self, sustained: bool) -> None:
        """A batch's handle emitted into its own buffer (``sustained``: at least as many events
        as it was handed); said once after FED_ITSELF_BATCHES such batches in a row."""
        self.fed_now = False
        self.fed_itself += 1
        if not sustained:
            self.fed_streak = 0
            return
        if self.fed_streak == 0:
            self._fed_since = time.monotonic()
        self.fed_streak += 1
        if (
            self.fed_streak >= FED_ITSELF_BATCHES
            and not self._fed_told
            and time.monotonic() - self._fed_since >= FED_ITSELF_SECONDS
        ):
            self._fed_told = True
            logger.warning(
                "sink %r feeds itself: in each of its last %d batches (%.1f s) its handle emitted "
                "events this same sink gets, at least as many as it was handed, so its task "
                "never rests: emit only event types outside its interests, or skip the events it "
                "emitted itself; counted in bus.stats() (fed_itself), said once",
                self.name,
                self.fed_streak,
                time.monotonic() - self._fed_since,
            )

    # -- failures --------------------------------------------------------------------------

    def count_failure(self, exc: BaseException, events: int) -> None:
        """A batch's ``handle`` failed (caught by ``Subscription._deliver``): counted, the first
        logged, with its traceback."""
        self.failed += events
        self.failed_batches += 1
        if self.first_error is None:
            self.first_error = one_line(exc)
            logger.error(
                "sink %r failed to handle a batch of %d events; its failures are counted "
                "in bus.stats() and not logged again",
                self.name,
                events,
                exc_info=exc,
            )

    def close_failed(self, exc: BaseException) -> None:
        """The sink's ``aclose()`` raised (caught by ``Subscription._close_sink``): logged with
        its traceback, kept for ``stats()`` (``close_error``)."""
        self.close_error = one_line(exc)
        logger.error("sink %r failed to close", self.name, exc_info=exc)

    def close_gave_up(self, timeout: float) -> None:
        """The sink's ``aclose()`` was still running at the close deadline (said by the bus)."""
        if self.close_error is None:
            self.close_error = f"aclose() still running after {timeout:.1f} s, given up on"
