"""Helpers for testing code that emits checkpoint events, shipped with the library.

``MemorySink`` keeps every event it is handed; ``capture_events()`` runs a block against a
fresh started bus with one ``MemorySink`` subscribed::

    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="resources", instance="r0")
        with tel.operation("commit", checkpoint_id="c1"):
            ...
    assert [type(e) for e in events] == [OperationStarted, OperationFinished]

The block's events are flushed into ``events`` when it ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from ckpt_events._bus import Bus
from ckpt_events._events import Event

__all__ = ["MemorySink", "capture_events"]

E = TypeVar("E", bound=Event)


class MemorySink:
    """A sink that appends every event to ``events`` and counts the batches it got."""

    def __init__(self, interests: Iterable[type[Event]] | None = None) -> None:
        self.interests = None if interests is None else tuple(interests)
        self.events: list[Any] = []
        self.batches = 0
        self.closed = False

    def handle(self, batch: list[Event]) -> None:
        self.batches += 1
        self.events.extend(batch)

    async def aclose(self) -> None:
        self.closed = True

    def of_type(self, cls: type[E]) -> list[E]:
        """The events that are instances of ``cls``, in order."""
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
