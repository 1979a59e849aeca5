"""The sink interface (``ckpt_events._sink``): the protocols the bus reads once, and ``BaseSink``'s
defaults."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_events import (
    BaseSink,
    BlockingSink,
    Bus,
    ClosableSink,
    LingeringSink,
    Refused,
    Sink,
    WantsEvents,
)
from ckpt_events.testing import MemorySink
from tests.ckpt_events.test_bus import refused


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
    assert bus.stats().sink("_Collect").delivered == 1


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
