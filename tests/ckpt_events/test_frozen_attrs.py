"""``FrozenAttributes`` (``ckpt_events._frozen_attrs``): a finished span's attributes, read-only
for every sink."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import msgspec
import pytest

from ckpt_events import Bus, OperationFinished, Telemetry
from ckpt_events._frozen_attrs import ENDED, FrozenAttributes
from tests.ckpt_events.test_span_base import _Keep


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


def test_every_mutator_raises_and_reading_works_as_a_dict() -> None:
    """Each dict mutator is a TypeError; reads, equality and dict() copies behave as a dict's."""
    frozen = FrozenAttributes({"user.a": 1, "b": "x"})
    mutators = [
        lambda: frozen.__setitem__("c", 1),
        lambda: frozen.__delitem__("b"),
        lambda: frozen.__ior__({"c": 1}),
        frozen.clear,
        lambda: frozen.pop("b"),
        frozen.popitem,
        lambda: frozen.setdefault("c", 1),
        lambda: frozen.update(c=1),
    ]
    for mutate in mutators:
        with pytest.raises(TypeError, match="copy them with dict"):
            mutate()
    assert frozen == {"user.a": 1, "b": "x"} and frozen["b"] == "x" and len(frozen) == 2
    thawed = dict(frozen)
    thawed["c"] = 3
    assert "c" not in frozen and not ENDED


def test_copies_are_itself_and_pickling_and_json_keep_the_values() -> None:
    """copy() and deepcopy() return the same object; pickle keeps the class; msgspec encodes a dict."""
    frozen = FrozenAttributes({"user.a": 1, "ok": True})
    assert copy.copy(frozen) is frozen and copy.deepcopy(frozen) is frozen
    restored = pickle.loads(pickle.dumps(frozen))
    assert type(restored) is FrozenAttributes and restored == frozen
    assert msgspec.json.decode(msgspec.json.encode(frozen)) == {"user.a": 1, "ok": True}
