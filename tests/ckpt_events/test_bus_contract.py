"""``ckpt_events._bus_contract``: a real bus, its buffers and ``Telemetry`` keep the declared contract."""

from __future__ import annotations

from ckpt_events import Bus, OperationFinished, OperationStarted, Telemetry
from ckpt_events._bus_contract import EventBuffer, InterestListener, RoutingBus
from ckpt_events._subscription import _Buffer
from ckpt_events.testing import MemorySink, capture_events


class _Listener:
    """An ``InterestListener``: counts how often the bus says interests changed."""

    def __init__(self) -> None:
        self.changes = 0

    def _interest_changed(self) -> None:
        self.changes += 1


async def test_the_bus_routes_to_buffers_of_the_declared_shape_and_tells_its_listeners() -> None:
    """Routes are replaced whole on subscribe, map to ``EventBuffer``-shaped buffers, and every
    registered ``InterestListener`` is told; ``wants`` reads the same table."""
    listener = _Listener()
    async with capture_events([OperationFinished]) as (bus, _events):
        routing: RoutingBus[_Buffer] = bus
        routing._add_listener(listener)
        before = routing._routes
        assert routing.wants(OperationFinished) and not routing.wants(OperationStarted)
        bus.subscribe(MemorySink([OperationStarted]), name="second")
        assert listener.changes == 1
        assert routing._routes is not before and OperationStarted not in before
        [buffer] = routing._routes[OperationStarted]
        shape: EventBuffer = buffer
        assert (len(shape), shape.dropped, shape.capacity > 0) == (0, 0, True)
        assert shape.waiting is False


async def test_telemetry_is_an_interest_listener_and_reroutes_when_told() -> None:
    """``Telemetry`` registers as the bus's listener: a later subscribe turns its no-op spans live."""
    async with Bus() as bus:
        tel = Telemetry(bus, kind="environment", instance="environment-0")
        listener: InterestListener = tel
        with tel.operation("commit") as op:
            assert op.traceparent() is None
        sink = MemorySink([OperationFinished])
        bus.subscribe(sink, name="late")
        assert callable(listener._interest_changed)
        with tel.operation("commit") as op:
            assert op.traceparent() is not None
        await bus.flush()
    assert [type(e) for e in sink.events] == [OperationFinished]
