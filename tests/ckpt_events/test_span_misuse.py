"""Misusing a span handle or an event cannot change what other sinks see: a finished span's
attributes are frozen, a ``set_attribute`` after the block is ignored, and a handle ends once."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_events import Bus, CoordinateFinished, OperationFinished, OperationStarted, Telemetry


class _Keep:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def handle(self, batch: list[Any]) -> None:
        self.events.extend(batch)


class _Vandal:
    """Tries to change every event's attributes under the other sinks."""

    def __init__(self) -> None:
        self.refused = 0

    def handle(self, batch: list[Any]) -> None:
        for event in batch:
            if getattr(event, "attributes", None) is not None:
                try:
                    event.attributes["user.a"] = "changed"
                except TypeError:
                    self.refused += 1
                with pytest.raises(TypeError):
                    event.attributes.update({"user.b": 1})


async def test_a_sink_cannot_change_the_attributes_its_neighbours_see() -> None:
    """The one event every sink shares keeps its attributes whatever a sink does with them."""
    vandal, keep = _Vandal(), _Keep()
    async with Bus() as bus:
        bus.subscribe(vandal)
        bus.subscribe(keep)
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        with tel.operation("commit", checkpoint_id="c1") as op:
            op.set_attribute("user.a", 1)
        await bus.flush()
    [event] = [e for e in keep.events if isinstance(e, OperationFinished)]
    assert event.attributes == {"user.a": 1}
    assert dict(event.attributes) == {"user.a": 1}  # a copy is an ordinary dict
    assert vandal.refused == 1
    assert [sink.failed for sink in bus.stats().sinks] == [0, 0]


async def test_set_attribute_after_the_block_does_not_rewrite_a_delivered_event() -> None:
    """After delivery, ``set_attribute`` on the ended handle is ignored (it rewrote the event)."""
    keep = _Keep()
    async with Bus() as bus:
        bus.subscribe(keep)
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        with tel.operation("commit", checkpoint_id="c1") as op:
            op.set_attribute("user.a", 1)
        with tel.operation("commit", checkpoint_id="c1") as bare:
            pass
        with tel.coordinate("commit", checkpoint_id="c1") as co:
            co.set_attribute("user.a", 1)
        await bus.flush()
        op.set_attribute("user.a", 2)
        op.set_attribute("user.new", 3)
        bare.set_attribute("user.new", 3)
        co.set_attribute("user.a", 2)
        await bus.flush()
    ops = [e for e in keep.events if isinstance(e, OperationFinished)]
    [coordinate] = [e for e in keep.events if isinstance(e, CoordinateFinished)]
    assert [e.attributes for e in ops] == [{"user.a": 1}, None]
    assert coordinate.attributes == {"user.a": 1}


async def test_re_entering_a_finished_handle_emits_nothing_more() -> None:
    """A second ``with`` on an ended handle gives no second event with the same span id."""
    keep = _Keep()
    async with Bus() as bus:
        bus.subscribe(keep)
        tel = Telemetry(bus, kind="agent", instance="agent-0")
        ctl = Telemetry(bus, kind="controller", instance="coordination")
        op = tel.operation("commit", checkpoint_id="c1")
        co = ctl.coordinate("commit", checkpoint_id="c1")
        for _ in range(2):
            with op, co:
                pass
        await bus.flush()
    finished = [e for e in keep.events if isinstance(e, OperationFinished | CoordinateFinished)]
    started = [e for e in keep.events if isinstance(e, OperationStarted)]
    assert sorted(e.span_id for e in finished) == sorted([op.span_id, co.span_id])
    assert [e.span_id for e in started] == [op.span_id]
