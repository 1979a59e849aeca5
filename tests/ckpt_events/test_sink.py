"""The sink interface (``ckpt_events._sink``): the protocols the bus reads once, and ``BaseSink``'s
defaults."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import anyio
import pytest

from ckpt_events import (
    BaseSink,
    BlockingSink,
    Bus,
    ClosableSink,
    InvalidTypeError,
    LingeringSink,
    Refused,
    Sink,
    WantsEvents,
)
from ckpt_events.testing import MemorySink
from tests.ckpt_events.test_bus import refused
from tests.typecheck import mypy_strict


class _Collect(BaseSink):
    """A BaseSink that only writes handle()."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def handle(self, batch: list[Any], /) -> None:
        self.events.extend(batch)


async def test_a_base_sink_gets_every_event_and_is_closed_by_the_bus() -> None:
    """BaseSink's defaults: every event, on the loop, no linger, an aclose() the bus awaits."""
    sink = _Collect()
    async with Bus() as bus:
        sub = bus.subscribe(sink)
        assert sub.linger == 0 and sub.interests == bus.subscribe(MemorySink()).interests
        bus.emit(refused(1))
        await bus.flush(timeout=5)
        assert [e.time_ns for e in sink.events] == [1]
    assert bus.stats().sink("Collect").delivered == 1  # the rule's name: no leading "_"


async def test_a_base_sink_without_handle_fails_its_batches() -> None:
    """handle() left as BaseSink's raises NotImplementedError: each batch is counted as failed."""
    async with Bus() as bus:
        bus.subscribe(BaseSink(), name="bare")
        bus.emit(refused(1))
        await bus.flush(timeout=5)
    with pytest.raises(NotImplementedError):
        BaseSink().handle([])
    assert bus.stats().sink("bare").failed == 1


def test_the_optional_members_are_seen_by_isinstance() -> None:
    """BaseSink satisfies every protocol; a bare handle() object only Sink."""

    class Bare:
        def handle(self, batch: list[Any]) -> None:
            pass

    protocols = (Sink, WantsEvents, BlockingSink, LingeringSink, ClosableSink)
    assert all(isinstance(BaseSink(), p) for p in protocols)
    assert [p for p in protocols if isinstance(Bare(), p)] == [Sink]
    assert not isinstance(Refused, Sink)


def _plain_wrapper(handle: Any) -> Any:
    """A sync decorator, as a tracing or retry helper writes one: it hides an async def."""

    @functools.wraps(handle)
    def wrapper(*args: Any) -> Any:
        return handle(*args)

    return wrapper


class _DecoratedAsync:
    """An async ``handle`` behind a plain decorator: not a coroutine function to ``inspect``."""

    def __init__(self, blocking: bool = False) -> None:
        self.blocking = blocking
        self.events: list[Any] = []

    @_plain_wrapper
    async def handle(self, batch: list[Any], /) -> None:
        await anyio.sleep(0)
        self.events.extend(batch)


class _AsyncCallable:
    """A sink whose ``handle`` is an object with an async ``__call__``."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.handle = self._Handle(self.events)

    class _Handle:
        def __init__(self, events: list[Any]) -> None:
            self.events = events

        async def __call__(self, batch: list[Any], /) -> None:
            self.events.extend(batch)


@pytest.mark.parametrize(
    "make",
    [_DecoratedAsync, _AsyncCallable, lambda: _DecoratedAsync(blocking=True)],
    ids=["decorated", "async-call", "decorated-blocking"],
)
async def test_a_handle_that_returns_an_awaitable_is_awaited(make: Any) -> None:
    """A ``handle`` that returns a coroutine without being a coroutine function gets its events
    (they were counted delivered while the coroutine was never awaited: a RuntimeWarning only)."""
    sink = make()
    async with Bus() as bus:
        bus.subscribe(sink, name="awaitable")
        bus.emit(refused(1))
        bus.emit(refused(2))
        await bus.flush(timeout=5)
        assert [e.time_ns for e in sink.events] == [1, 2]
    assert bus.stats().sink("awaitable").delivered == 2


@pytest.mark.parametrize("blocking", ["false", 1, None])
async def test_a_blocking_that_is_not_a_bool_is_refused_at_subscribe(blocking: object) -> None:
    """``blocking = "false"`` (read from a config file, say) is refused by name; read as truth, it
    sent ``handle`` to a worker thread."""

    class Configured(_Collect):
        def __init__(self) -> None:
            super().__init__()
            self.blocking = blocking

    async with Bus() as bus:
        with pytest.raises(InvalidTypeError, match=r"^a sink's blocking must be True or False, not "):
            bus.subscribe(Configured())
        assert bus.stats().sinks == ()


async def test_a_generator_handle_is_refused_at_subscribe() -> None:
    """A ``handle`` that yields (sync or async) runs none of its body when called: refused by
    name at subscribe (its batches were counted delivered and never seen)."""

    class Yields:
        def handle(self, batch: list[Any], /) -> Any:
            yield from batch

    class AsyncYields:
        async def handle(self, batch: list[Any], /) -> Any:
            for event in batch:
                yield event

    async with Bus() as bus:
        for sink in (Yields(), AsyncYields()):
            with pytest.raises(InvalidTypeError, match=r"not yield: \w+\.handle is a generator function$"):
                bus.subscribe(sink, name="yields")
        assert bus.stats().sinks == ()


class _WrappedGenerator:
    """A ``handle`` that is no generator function but returns a generator (a plain decorator, a
    lambda): ``inspect`` sees a plain ``def``, so it passes subscribe."""

    def __init__(self, *, asynchronous: bool = False) -> None:
        self.events: list[Any] = []
        self.handle = self._async_body if asynchronous else self._body

    def _body(self, batch: list[Any], /) -> Any:
        return self._gen(batch)

    def _async_body(self, batch: list[Any], /) -> Any:
        return self._agen(batch)

    def _gen(self, batch: list[Any]) -> Any:
        self.events.extend(batch)
        yield

    async def _agen(self, batch: list[Any]) -> Any:
        self.events.extend(batch)
        yield


@pytest.mark.parametrize("asynchronous", [False, True], ids=["generator", "async-generator"])
async def test_a_handle_returning_a_generator_fails_its_batches_by_name(
    asynchronous: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``handle`` returning a generator ran none of its body, and its batches were counted
    delivered: now each batch is counted failed, the first logged with the reason."""
    sink = _WrappedGenerator(asynchronous=asynchronous)
    async with Bus() as bus:
        bus.subscribe(sink, name="wrapped")
        bus.emit(refused(1))
        await bus.flush(timeout=5)
        bus.emit(refused(2))
        await bus.flush(timeout=5)
    stats = bus.stats().sink("wrapped")
    assert (stats.delivered, stats.failed, stats.failed_batches) == (0, 2, 2)
    assert stats.error is not None and "returned a generator" in stats.error
    assert caplog.text.count("'wrapped' failed to handle") == 1
    assert sink.events == []


def test_a_user_sink_satisfies_the_protocols_under_mypy_strict(tmp_path: Path, mypy_cache: Path) -> None:
    """The optional members as users write them (``interests = (Refused, OperationFinished)``,
    ``linger = 0.5``, a ``BaseSink`` subclass's narrowed ``interests``) satisfy ``WantsEvents``,
    ``LingeringSink`` and ``BlockingSink`` for ``mypy --strict`` (they were settable protocol
    attributes, so a narrower type was an error on correct code)."""
    errors = mypy_strict(
        """
        from typing import Any

        from ckpt_events import (
            BaseSink, BlockingSink, ClosableSink, LingeringSink, OperationFinished, Refused, Sink,
            WantsEvents,
        )


        class Alerts:
            interests = (Refused, OperationFinished)
            blocking = True
            linger = 0.5

            def handle(self, batch: list[Any]) -> None:
                pass

            async def aclose(self) -> None:
                pass


        class One:
            interests = Refused

            async def handle(self, batch: list[Any]) -> None:
                pass


        class Inherits(BaseSink):
            interests = (Refused,)
            linger = 0.1

            def handle(self, batch: list[Any], /) -> None:
                pass


        def takes(
            sink: Sink, wants: WantsEvents, blocks: BlockingSink, lingers: LingeringSink,
            closes: ClosableSink,
        ) -> None:
            pass


        takes(Alerts(), Alerts(), Alerts(), Alerts(), Alerts())
        takes(One(), One(), Inherits(), Inherits(), Inherits())
        takes(Inherits(), Inherits(), Inherits(), Inherits(), Inherits())
        """,
        tmp_path,
        mypy_cache,
    )
    assert errors == []


class _NoBatch:
    def handle(self) -> None:
        pass


class _KeywordOnly:
    def handle(self, *, batch: list[Any]) -> None:
        pass


class _TwoArgs:
    def handle(self, batch: list[Any], extra: int) -> None:
        pass


@pytest.mark.parametrize(
    ("sink", "said"),
    [
        (_NoBatch(), r"^_NoBatch\.handle cannot take a batch \(too many positional arguments\): "),
        (_KeywordOnly(), r"^_KeywordOnly\.handle cannot take a batch \(too many positional arguments\): "),
        (_TwoArgs(), r"^_TwoArgs\.handle cannot take a batch \(missing a required argument: 'extra'\): "),
        (_Collect, r"^_Collect is a class: subscribe an instance of it, _Collect\(\)$"),
    ],
    ids=["no-batch", "keyword-only", "two-args", "a-class"],
)
async def test_a_handle_that_cannot_take_a_batch_is_refused_at_subscribe(sink: Any, said: str) -> None:
    """A ``handle`` that cannot be called with one batch (written without it, keyword-only, with
    a second required argument; a sink's class given for an instance) was subscribed, and every
    batch failed with a TypeError: refused at subscribe in one line naming the fix."""
    async with Bus() as bus:
        with pytest.raises(InvalidTypeError, match=said):
            bus.subscribe(sink)
        assert bus.stats().sinks == ()


class _ClassLevel:
    """A sink that is a class: its handle a classmethod, its events kept on the class."""

    events: list[Any] = []  # noqa: RUF012  # the class itself is the sink

    @classmethod
    def handle(cls, batch: list[Any], /) -> None:
        cls.events.extend(batch)


async def test_a_class_whose_handle_takes_a_batch_is_a_sink_named_after_it() -> None:
    """A class with a classmethod (or staticmethod) handle is a sink as it is, named after the
    class (its stats said ``type``, its metaclass's name, and a second one ``type-2``)."""
    async with Bus() as bus:
        sub = bus.subscribe(_ClassLevel)
        bus.emit(refused(1))
        await bus.flush(timeout=5)
    assert sub.name == "ClassLevel" and [e.time_ns for e in _ClassLevel.events] == [1]
