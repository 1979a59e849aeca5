"""Shutdown under faults: stuck sinks, foreign tasks and cancel scopes, sinks raising BaseException."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import subprocess
import sys
import threading
import time
from typing import Any

import anyio
import pytest

from ckpt_events import (
    Bus,
    Event,
    InvalidValueError,
    OperationFinished,
    OperationStarted,
    Refused,
    Telemetry,
)
from ckpt_events.testing import MemorySink
from ckpt_events.vocab import ErrorCode, Kind

DEADLINE = 0.3
#: A stuck close must end within the deadline plus this (a loaded CI machine included).
SLACK = 2.0


def refused(i: int) -> Refused:
    return Refused(kind=Kind.AGENT, instance=f"a{i}", time_ns=i, code=ErrorCode.ADMISSION_CLOSED)


class StuckInThread:
    """A blocking sink whose handle() hangs in its worker thread until released."""

    blocking = True
    linger = 0.0

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def handle(self, batch: list[Event]) -> None:
        self.entered.set()
        self.release.wait(30)  # bounded: the test releases it


class NeverCloses:
    """A sink whose own aclose() never returns."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def handle(self, batch: list[Event]) -> None:
        self.events.extend(batch)

    async def aclose(self) -> None:
        await anyio.sleep_forever()


class RaisesBase:
    """A sink raising a BaseException that is not cancellation."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def handle(self, batch: list[Event]) -> None:
        raise self.exc


async def test_close_returns_within_its_deadline_when_a_blocking_sink_is_stuck(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A handle stuck in its thread is abandoned at the deadline, counted and named once."""
    stuck = StuckInThread()
    bus = Bus(close_timeout=DEADLINE)
    try:
        async with bus:
            bus.subscribe(stuck, name="stuck")
            healthy = MemorySink()
            bus.subscribe(healthy, name="healthy")
            bus.emit(refused(0))
            await anyio.to_thread.run_sync(stuck.entered.wait, 5)
            for i in range(1, 4):
                bus.emit(refused(i))
            began = time.monotonic()
        took = time.monotonic() - began
    finally:
        stuck.release.set()
    assert took < DEADLINE + SLACK
    stats = bus.stats().sink("stuck")
    assert (stats.abandoned, stats.pending, stats.emitted) == (4, 0, 4)
    assert len(healthy.events) == 4
    warnings = [r for r in caplog.records if "still busy" in r.getMessage()]
    assert len(warnings) == 1 and "'stuck'" in warnings[0].getMessage()


async def test_close_returns_within_its_deadline_when_a_sinks_aclose_never_returns() -> None:
    """A sink's own aclose() that hangs is cut off at the deadline; its events were delivered."""
    sink = NeverCloses()
    bus = Bus(close_timeout=DEADLINE)
    with anyio.fail_after(DEADLINE + SLACK):
        async with bus:
            bus.subscribe(sink, name="never")
            bus.emit(refused(1))
    assert len(sink.events) == 1
    assert bus.stats().sink("never").delivered == 1


@pytest.mark.parametrize("scope", ["move_on_after", "fail_after"])
async def test_aclose_inside_a_cancel_scope(scope: str) -> None:
    """aclose() inside the caller's move_on_after/fail_after drains and closes, no scope error."""
    sink = MemorySink()
    async with Bus() as bus:
        bus.subscribe(sink)
        bus.emit(refused(1))
        with getattr(anyio, scope)(5):
            await bus.aclose()
        assert sink.closed
    assert len(sink.events) == 1


async def test_aclose_from_another_task() -> None:
    """aclose() from a task other than the one that entered the bus works."""
    sink = MemorySink()
    async with Bus() as bus:
        bus.subscribe(sink)
        bus.emit(refused(1))
        async with anyio.create_task_group() as tg:
            tg.start_soon(bus.aclose)
        assert sink.closed
    assert len(sink.events) == 1


async def _in_two_tasks(enter: Any, leave: Any) -> None:
    """Run ``enter`` in one asyncio task to its end, then ``leave`` in another: what a
    pytest-asyncio async fixture does with its setup and its teardown (asyncio tasks, as it
    makes them: a task of an anyio task group may not end inside a cancel scope it entered)."""
    await asyncio.create_task(enter())
    await asyncio.create_task(leave())


async def test_a_bus_left_by_another_task_than_entered_it_delivers_and_says_so() -> None:
    """A bus entered in one task and left in another (a pytest-asyncio async fixture) delivers
    what was emitted, closes its sinks and raises one precise error (was anyio's "Attempted to
    exit cancel scope in a different task", twice, chained)."""
    bus = Bus()
    sink = MemorySink()
    raised: list[BaseException] = []

    async def enter() -> None:
        await bus.__aenter__()
        bus.subscribe(sink)
        bus.emit(refused(1))

    async def leave() -> None:
        try:
            await bus.__aexit__(None, None, None)
        except Exception as exc:  # checked below
            raised.append(exc)

    await _in_two_tasks(enter, leave)
    (error,) = raised
    assert isinstance(error, InvalidValueError)
    assert str(error).startswith("a Bus was entered in one task and left in another")
    assert "ckpt_capture" in str(error) and "\n" not in str(error)
    assert error.__context__ is None
    assert sink.closed
    assert len(sink.events) == 1


async def test_a_bus_left_by_another_task_with_an_exception_lets_it_through() -> None:
    """Left by another task while an exception propagates, the bus delivers and closes, and the
    caller's exception comes out as it was raised, not replaced by the bus's error."""
    bus = Bus()
    sink = MemorySink()
    returned: list[bool | None] = []

    async def enter() -> None:
        await bus.__aenter__()
        bus.subscribe(sink)
        bus.emit(refused(1))

    async def leave() -> None:
        returned.append(await bus.__aexit__(KeyError, KeyError("yours"), None))

    await _in_two_tasks(enter, leave)
    assert returned == [None]  # not swallowed: the caller re-raises its KeyError
    assert sink.closed
    assert len(sink.events) == 1


async def test_aclose_cancelled_by_the_caller_still_closes() -> None:
    """A caller's scope that expires mid-close does not leave sinks open or the bus broken."""
    stuck = StuckInThread()
    bus = Bus(close_timeout=DEADLINE)
    try:
        async with bus:
            bus.subscribe(stuck, name="stuck")
            bus.emit(refused(0))
            await anyio.to_thread.run_sync(stuck.entered.wait, 5)
            with anyio.move_on_after(0.05):
                await bus.aclose()
    finally:
        stuck.release.set()
    assert bus.stats().sink("stuck").abandoned == 1


async def test_a_bus_whose_owner_is_cancelled_closes_its_sinks_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Cancelled from outside (a Ctrl-C cancelling the command), the bus still closes each sink
    and returns at once: it waited its whole close_timeout (5 s) for delivery tasks already gone,
    then warned the sinks were 'still busy'."""
    sinks = [MemorySink(), MemorySink()]
    async with anyio.create_task_group() as tg:

        async def owner() -> None:
            async with Bus(close_timeout=5.0) as bus:
                for n, sink in enumerate(sinks):
                    bus.subscribe(sink, name=f"sink-{n}")
                bus.emit(refused(1))
                await bus.flush()
                await anyio.sleep_forever()

        tg.start_soon(owner)
        await anyio.wait_all_tasks_blocked()
        started = time.monotonic()
        tg.cancel_scope.cancel()
    closed_after = time.monotonic() - started
    assert closed_after < 1.0
    assert all(sink.closed and len(sink.events) == 1 for sink in sinks)
    assert "still busy" not in caplog.text


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), GeneratorExit()])
async def test_a_sink_raising_base_exception_does_not_break_its_neighbour(exc: BaseException) -> None:
    """SystemExit, KeyboardInterrupt and the like from one sink are counted; the other gets all."""
    healthy = MemorySink()
    async with Bus() as bus:
        bus.subscribe(RaisesBase(exc), name="bad")
        bus.subscribe(healthy, name="healthy")
        for i in range(5):
            bus.emit(refused(i))
            await bus.flush(timeout=5)
        stats = bus.stats()
    assert len(healthy.events) == 5
    assert stats.sink("bad").failed == 5


class StrayCancellation:
    """An async sink awaiting a future someone else cancelled (a pool closed under its request):
    a ``CancelledError`` that is not this task being cancelled; also from its ``aclose()``."""

    def __init__(self) -> None:
        self.calls = 0

    async def handle(self, batch: list[Event]) -> None:
        self.calls += 1
        await _cancelled_future()

    async def aclose(self) -> None:
        await _cancelled_future()


async def _cancelled_future() -> None:
    future = asyncio.get_running_loop().create_future()
    future.cancel()
    await future


async def test_a_sinks_stray_cancelled_error_is_its_failure_not_the_owners_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A CancelledError out of a sink's handle (or aclose) while nothing cancels the bus is the
    sink's failure, counted and logged once: it cancelled the code inside ``async with bus:``."""
    healthy = MemorySink()
    stray = StrayCancellation()
    body_finished = False
    with anyio.fail_after(10):
        async with Bus(close_timeout=DEADLINE) as bus:
            bus.subscribe(stray, name="stray")
            bus.subscribe(healthy, name="healthy")
            for i in range(3):
                bus.emit(refused(i))
                assert await bus.flush(timeout=5)
                await anyio.sleep(0.01)  # the owner's own awaits: where it was cancelled
            body_finished = True
    assert body_finished
    stats = bus.stats()
    assert len(healthy.events) == 3 and healthy.closed
    assert stats.sink("stray").failed == 3 and stray.calls == 3
    assert stats.sink("stray").error is not None and "CancelledError" in stats.sink("stray").error
    assert caplog.text.count("'stray' failed to handle") == 1
    assert "'stray' failed to close" in caplog.text


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_aclose_of_a_bus_never_entered_delivers_and_closes_its_sinks() -> None:
    """``await bus.aclose()`` without ``async with bus`` still delivers what was emitted and
    closes every sink, within its deadline: the events stayed pending for good, the sinks (a
    file, an exporter) were never closed, and nothing said so."""
    sink = MemorySink()
    stuck = NeverCloses()
    bus = Bus(close_timeout=DEADLINE)
    bus.subscribe(sink, name="memory")
    bus.subscribe(stuck, name="stuck")
    tel = Telemetry(bus, kind="resources", instance="r0")
    with tel.operation("commit"):
        pass
    started = time.monotonic()
    await bus.aclose()
    assert time.monotonic() - started < DEADLINE + SLACK
    assert sink.closed and [type(e) for e in sink.events] == [OperationStarted, OperationFinished]
    assert len(stuck.events) == 2
    stats = bus.stats()
    assert stats.sink("memory").delivered == 2 and stats.sink("memory").pending == 0
    await bus.aclose()  # idempotent
    with pytest.raises(InvalidValueError, match="entered once"):
        await bus.__aenter__()


async def test_shutdown_warning_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """Two stuck sinks make one warning naming both."""
    first, second = StuckInThread(), StuckInThread()
    caplog.set_level(logging.WARNING)
    try:
        async with Bus(close_timeout=DEADLINE) as bus:
            bus.subscribe(first, name="one")
            bus.subscribe(second, name="two")
            bus.emit(refused(0))
            await anyio.to_thread.run_sync(first.entered.wait, 5)
            await anyio.to_thread.run_sync(second.entered.wait, 5)
    finally:
        first.release.set()
        second.release.set()
    warnings = [r.getMessage() for r in caplog.records if "still busy" in r.getMessage()]
    assert len(warnings) == 1 and "'one'" in warnings[0] and "'two'" in warnings[0]


class _Finished:
    """Counts finished operations."""

    interests = (OperationFinished,)

    def __init__(self) -> None:
        self.seen = 0

    def handle(self, batch: list[Any]) -> None:
        self.seen += len(batch)


async def test_operations_from_threads_during_close_are_all_counted() -> None:
    """8 threads keep making operations while the bus closes: each one is delivered, dropped
    or counted in ``dropped_after_close`` (39,971 of 640,000 were counted nowhere)."""
    threads_n, per_thread = 8, 20_000
    bus = Bus()
    sink = _Finished()
    async with bus:
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        bus.subscribe(sink)
        go = threading.Event()

        def work() -> None:
            go.wait(5)
            for _ in range(per_thread):
                with tel.operation("commit", checkpoint_id="c1"):
                    pass

        threads = [threading.Thread(target=work) for _ in range(threads_n)]
        for thread in threads:
            thread.start()
        go.set()
        await anyio.sleep(0.02)
    for thread in threads:
        thread.join(30)
    stats = bus.stats()
    [sub] = stats.sinks
    assert sub.pending == 0
    assert sub.delivered == sink.seen
    counted = sub.delivered + sub.dropped + sub.failed + sub.abandoned + stats.dropped_after_close
    assert counted == threads_n * per_thread, (sub, stats.dropped_after_close, sink.seen)


_STUCK_FOR_GOOD = """
import threading, time, anyio
from ckpt_events import Bus, Refused

class Stuck:
    blocking = True
    linger = 0.0

    def handle(self, batch):
        print("stuck", flush=True)
        threading.Event().wait(120)  # an exporter on a dead socket

async def main():
    async with Bus(close_timeout=0.3) as bus:
        bus.subscribe(Stuck())
        bus.emit(Refused(kind="agent", instance="a0", time_ns=1, code="admission_closed"))
        await anyio.sleep(0.2)
    print("closed", bus.stats().sinks[0].abandoned, flush=True)

anyio.run(main)
"""


def test_a_sink_stuck_for_good_does_not_keep_the_process_alive() -> None:
    """The bus closes within its deadline and the interpreter exits: a stuck blocking sink runs on a
    daemon thread (anyio's worker threads are joined at exit, and the process never ended)."""
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-c", _STUCK_FOR_GOOD], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["stuck", "closed", "1"]
    assert time.monotonic() - started < 30  # the stuck handle waits 120 s


class _HangingClose:
    def handle(self, batch: list[Any]) -> None:
        pass

    async def aclose(self) -> None:
        await anyio.sleep(30)


class _StuckHandle:
    async def handle(self, batch: list[Any]) -> None:
        await anyio.sleep(30)


@pytest.mark.parametrize("sink", [_HangingClose, _StuckHandle])
async def test_the_close_deadline_covers_a_subscription_closed_earlier(sink: type[Any]) -> None:
    """A subscription closed before the bus (``sub.close()``: its sink still closing, or still
    handling a batch) was not waited on under the bus's deadline: a 1 s close took 20 s, and
    its pending events were never counted as abandoned."""
    began = time.monotonic()
    async with Bus(close_timeout=0.5) as bus:
        sub = bus.subscribe(sink(), name="gone")
        tel = Telemetry(bus, kind=Kind.AGENT, instance="a0")
        for _ in range(10):
            tel.refused(ErrorCode.STALE_ATTEMPT)
        await anyio.sleep(0.05)
        sub.close()
        for _ in range(5):
            tel.refused(ErrorCode.STALE_ATTEMPT)  # after close: routed nowhere
    assert time.monotonic() - began < 3
    stats = bus.stats().sink("gone")
    assert stats.emitted == 10 and stats.pending == 0
    assert stats.delivered + stats.abandoned == 10
    if sink is _StuckHandle:
        assert stats.abandoned == 10


async def test_a_plain_def_aclose_is_called(caplog: pytest.LogCaptureFixture) -> None:
    """A sink with a synchronous ``aclose()`` failed at close with "object NoneType can't be used
    in 'await' expression" (logged as the sink failing to close); it is called, not awaited."""
    closed: list[bool] = []

    class SyncClose:
        def handle(self, batch: list[Any]) -> None:
            pass

        def aclose(self) -> None:
            closed.append(True)

    async with Bus() as bus:
        bus.subscribe(SyncClose())
    assert closed == [True]
    assert not [r for r in caplog.records if "failed to close" in r.getMessage()]


class _AsyncCloseFails(MemorySink):
    """A sink whose async aclose() raises, as a file failing its last flush does."""

    async def aclose(self) -> None:  # type: ignore[override]
        raise OSError("disk full")


class _SyncCloseFails(MemorySink):
    """A sink whose plain-def aclose() raises."""

    def aclose(self) -> None:  # type: ignore[override]
        raise ValueError("boom")


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_sink_whose_aclose_fails_says_so_in_stats(caplog: pytest.LogCaptureFixture) -> None:
    """An ``aclose()`` that raises (async or plain def, at the bus's close or unsubscribed
    before it) is kept in ``stats()`` as ``close_error``, in one line: it was only logged, and
    stats read after the shutdown showed a clean sink."""
    async with Bus() as bus:
        early = bus.subscribe(_SyncCloseFails(), name="early")
        bus.subscribe(_AsyncCloseFails(), name="late")
        bus.subscribe(MemorySink(), name="clean")
        bus.emit(refused(0))
        await early.aclose()
        assert bus.stats().sink("early").close_error == "ValueError: boom"
    stats = bus.stats()
    assert stats.sink("late").close_error == "OSError: disk full"
    assert stats.sink("early").close_error == "ValueError: boom"
    assert stats.sink("clean").close_error is None
    assert stats.sink("late").delivered == 1 and stats.sink("late").error is None
    assert caplog.text.count("'late' failed to close") == 1


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_sink_stuck_in_its_aclose_says_so_in_stats() -> None:
    """An ``aclose()`` still running at the close deadline is given up on and said in
    ``close_error``: its events were delivered, so nothing else in stats told it apart."""
    async with Bus(close_timeout=DEADLINE) as bus:
        bus.subscribe(NeverCloses(), name="stuck")
        bus.emit(refused(0))
    stats = bus.stats().sink("stuck")
    assert stats.delivered == 1 and stats.abandoned == 0
    assert stats.close_error == f"aclose() still running after {DEADLINE:.1f} s, given up on"


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_sink_stuck_in_its_aclose_when_its_owner_is_cancelled_says_so_in_stats() -> None:
    """The owner cancelled: the sink's aclose() runs shielded, within the bus's deadline; given
    up on there, it is said in ``close_error`` too."""
    with anyio.fail_after(10), anyio.CancelScope() as owner:
        async with Bus(close_timeout=DEADLINE) as bus:
            bus.subscribe(NeverCloses(), name="stuck")
            bus.emit(refused(0))
            await anyio.sleep(0.02)
            owner.cancel()
            await anyio.sleep(5)
    assert bus.stats().sink("stuck").close_error is not None


#: asyncio, and trio where it is installed (it is in the ``dev`` extra): on trio a service is
#: shut down by cancelling its nursery, the owner's cancellation these tests are about.
BOTH_BACKENDS = pytest.mark.parametrize(
    "anyio_backend",
    [
        "asyncio",
        pytest.param(
            "trio",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("trio") is None, reason="trio is not installed (pip install trio)"
            ),
        ),
    ],
)


class _AsyncMemory(MemorySink):
    """A MemorySink whose handle awaits, as an exporter's does."""

    async def handle(self, batch: list[Event]) -> None:  # type: ignore[override]
        await anyio.sleep(0.001)
        self.events.extend(batch)


class _BlockingMemory(MemorySink):
    """A MemorySink whose handle runs in the subscription's thread."""

    blocking = True

    def handle(self, batch: list[Event]) -> None:
        time.sleep(0.001)
        self.events.extend(batch)


@BOTH_BACKENDS
@pytest.mark.parametrize("sink_class", [MemorySink, _AsyncMemory, _BlockingMemory])
async def test_a_bus_whose_owner_is_cancelled_delivers_what_it_holds(
    sink_class: type[MemorySink], caplog: pytest.LogCaptureFixture
) -> None:
    """Cancelled from outside with events buffered (a task group whose other task failed, a trio
    nursery cancelled to shut down), the bus still delivers them and the operation's end its
    owner emits as it unwinds: they were dropped, told as a full buffer of 65,536 holding 3."""
    sink = sink_class()
    with anyio.fail_after(10), anyio.CancelScope() as owner:
        async with Bus() as bus:
            bus.subscribe(sink, name="memory")
            tel = Telemetry(bus, kind=Kind.AGENT, instance="a0")
            await anyio.sleep(0.02)  # the delivery task waits: the emits below wake it
            with tel.operation("commit", checkpoint_id="c1"):
                bus.emit(refused(1))
                owner.cancel()
                await anyio.sleep(5)
    assert [type(e) for e in sink.events] == [OperationStarted, Refused, OperationFinished]
    assert sink.closed
    stats = bus.stats().sink("memory")
    assert (stats.delivered, stats.dropped, stats.pending, stats.abandoned) == (3, 0, 0, 0)
    assert "buffer was full" not in caplog.text


@BOTH_BACKENDS
async def test_a_sink_stuck_when_its_owner_is_cancelled_is_counted_within_the_deadline() -> None:
    """A sink stuck in handle when the owner is cancelled: the close ends within the deadline and
    each event is counted once, abandoned (the batch cancelled in its hands stayed pending)."""
    began = time.monotonic()
    with anyio.CancelScope() as owner:
        async with Bus(close_timeout=DEADLINE) as bus:
            bus.subscribe(_StuckHandle(), name="stuck")
            for i in range(5):
                bus.emit(refused(i))
            await anyio.sleep(0.05)  # the first batch is in the sink's hands
            for i in range(5):
                bus.emit(refused(i))
            owner.cancel()
            await anyio.sleep(5)
    assert time.monotonic() - began < DEADLINE + SLACK
    stats = bus.stats().sink("stuck")
    assert (stats.emitted, stats.abandoned, stats.pending, stats.delivered) == (10, 10, 0, 0)


@BOTH_BACKENDS
@pytest.mark.parametrize("sink_class", [_AsyncMemory, _BlockingMemory])
async def test_aclose_of_a_bus_never_entered_in_a_cancelled_scope_delivers(
    sink_class: type[MemorySink],
) -> None:
    """``aclose()`` of a bus never entered, from a scope already cancelled, delivers to a sink that
    awaits: its delivery tasks were cancelled as they started, the events left pending for good."""
    sink = sink_class()
    bus = Bus(close_timeout=5)
    bus.subscribe(sink, name="memory")
    for i in range(3):
        bus.emit(refused(i))
    with anyio.CancelScope() as scope:
        scope.cancel()
        await bus.aclose()
    assert len(sink.events) == 3 and sink.closed
    stats = bus.stats().sink("memory")
    assert (stats.delivered, stats.pending, stats.abandoned) == (3, 0, 0)


class _ClosesTheBus(MemorySink):
    """A sink that closes the bus it is on: at its first batch (a "stop after this" sink), or in
    its own aclose()."""

    def __init__(self, bus: Bus, *, in_aclose: bool) -> None:
        super().__init__()
        self.bus = bus
        self.in_aclose = in_aclose

    async def handle(self, batch: list[Event]) -> None:  # type: ignore[override]
        self.events.extend(batch)
        if not self.in_aclose:
            await self.bus.aclose()

    async def aclose(self) -> None:
        if self.in_aclose:
            await self.bus.aclose()
        await super().aclose()


@BOTH_BACKENDS
@pytest.mark.parametrize("in_aclose", [False, True], ids=["in-handle", "in-aclose"])
async def test_a_bus_closed_inside_a_sinks_own_call_closes_without_waiting_for_it(
    in_aclose: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """``await bus.aclose()`` inside a sink's handle (or its aclose) waited for every sink, that
    one included, so for the whole close deadline; then it gave the sink up as "still busy",
    abandoned its batch (and never finished its aclose). Now the close does not wait for the
    call it was made from: the batch is delivered, every sink closed, well within the deadline."""
    other = MemorySink()
    with anyio.fail_after(SLACK):
        async with Bus(close_timeout=SLACK) as bus:
            sink = _ClosesTheBus(bus, in_aclose=in_aclose)
            bus.subscribe(sink, name="closer")
            bus.subscribe(other, name="other")
            bus.emit(refused(1))
            await anyio.sleep(0.01)
            assert bus.stats().sink("closer").delivered == 1
            if not in_aclose:
                bus.emit(refused(2))  # after the close: counted, not delivered
    stats = bus.stats()
    assert [(s.delivered, s.abandoned, s.failed) for s in stats.sinks] == [(1, 0, 0), (1, 0, 0)]
    assert stats.dropped_after_close == (0 if in_aclose else 1)
    assert sink.closed and other.closed and "still busy" not in caplog.text
