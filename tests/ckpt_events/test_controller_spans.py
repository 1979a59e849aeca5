"""The controller's span handles (``ckpt_events._controller_spans``): collection, coordinate and
stage spans as Started/Finished pairs with the right parents, attributes and errors."""

from __future__ import annotations

import time

import pytest

from ckpt_events import (
    CollectionFinished,
    CollectionStarted,
    CoordinateFinished,
    CoordinateStarted,
    InvalidArgumentError,
    StageFinished,
    StageStarted,
    Telemetry,
)
from ckpt_events.testing import capture_events
from ckpt_events.vocab import Kind, Outcome
from tests.ckpt_events.test_positional_fields import _fields, _only

_CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(("prepared", "stop", "published"), [(True, True, False), (False, False, True)])
async def test_controller_span_fields_land_in_their_own_slots(
    prepared: bool, stop: bool, published: bool
) -> None:
    """Coordinate, stage and collection spans: distinct values (booleans both ways) read back,
    the caller's tracestate last on every event of the trace (the children inherit it)."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="controller", instance="coordination")
        before = time.monotonic_ns()
        span = tel.collection("checkpoint", checkpoint_id="ck-3", traceparent=_CALLER)
        with span.with_tracestate("ot=th:8,dd=s:1") as collection:
            with tel.coordinate("prepare", checkpoint_id="ck-3", parent=collection) as coordinate:
                with coordinate.stage("agent") as stage:
                    stage.set(participants=31)
                    stage.set_attribute("user.stage", True)
                coordinate.set(
                    participants=41, prepared=prepared, stopped_at="agent", episodes=42, rollouts=43
                )
            collection.set(in_flight=51, stop=stop, published=published, rows=52, restarts=53)
        after = time.monotonic_ns()
    coll_started, coll = _only(events, CollectionStarted), _only(events, CollectionFinished)
    coord_started, coord = _only(events, CoordinateStarted), _only(events, CoordinateFinished)
    stage_started, stage_end = _only(events, StageStarted), _only(events, StageFinished)

    common = {"kind": Kind.CONTROLLER, "instance": "coordination", "checkpoint_id": "ck-3", "sampled": True}
    common["tracestate"] = "ot=th:8,dd=s:1"
    base = {"parent_remote": False, "outcome": Outcome.OK, "error_type": None, "error_message": None}
    assert _fields(coll) == {
        **common,
        **base,
        "parent_remote": True,
        "trace_id": 0x0AF7651916CD43DD8448EB211C80319C,
        "span_id": coll_started.span_id,
        "start_ns": coll_started.start_ns,
        "end_ns": coll.end_ns,
        "action": "checkpoint",
        "parent_span_id": 0xB7AD6B7169203331,
        "attributes": None,
        "in_flight": 51,
        "stop": stop,
        "published": published,
        "rows": 52,
        "restarts": 53,
        "worker": None,
    }
    assert _fields(coord) == {
        **common,
        **base,
        "trace_id": coll_started.trace_id,
        "span_id": coord_started.span_id,
        "start_ns": coord_started.start_ns,
        "end_ns": coord.end_ns,
        "operation": "prepare",
        "parent_span_id": coll_started.span_id,
        "attributes": None,
        "participants": 41,
        "prepared": prepared,
        "stopped_at": Kind.AGENT,
        "episodes": 42,
        "rollouts": 43,
        "worker": None,
        # The monotonic clock read beside its start (what a report times its roots by).
        "monotonic_start_ns": coord.monotonic_start_ns,
    }
    assert before <= coord.monotonic_start_ns <= after
    assert _fields(stage_end) == {
        **common,
        **base,
        "trace_id": coll_started.trace_id,
        "span_id": stage_started.span_id,
        "start_ns": stage_started.start_ns,
        "end_ns": stage_end.end_ns,
        "stage": Kind.AGENT,
        "parent_span_id": coord_started.span_id,
        "attributes": {"user.stage": True},
        "participants": 31,
        "worker": None,
    }
    for started in (coll_started, coord_started, stage_started):
        assert started.__struct_fields__[-2:] == ("worker", "tracestate")
        assert started.tracestate == "ot=th:8,dd=s:1"


async def test_pairs_nest_in_order_and_an_error_ends_each_span_it_leaves() -> None:
    """Each span's Started comes before its children's, its Finished after; an exception leaving
    a stage marks the stage and the coordinate that it crosses, not the collection that catches it."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="controller", instance="coordination")
        with tel.collection("checkpoint", checkpoint_id="ck-9") as collection:
            try:
                with tel.coordinate("prepare", parent=collection) as coordinate:
                    with coordinate.stage("model"):
                        raise TimeoutError("model-0 did not answer")
            except TimeoutError:
                pass
    assert [type(e) for e in events] == [
        CollectionStarted,
        CoordinateStarted,
        StageStarted,
        StageFinished,
        CoordinateFinished,
        CollectionFinished,
    ]
    stage, coord, coll = events[3], events[4], events[5]
    assert stage.parent_span_id == coord.span_id and coord.parent_span_id == coll.span_id
    assert len({stage.trace_id, coord.trace_id, coll.trace_id}) == 1
    assert stage.stage == Kind.MODEL and coll.action == "checkpoint"
    assert (stage.outcome, stage.error_type) == (Outcome.ERROR, "TimeoutError")
    assert (coord.outcome, coord.error_message) == (Outcome.ERROR, "model-0 did not answer")
    assert coll.outcome is Outcome.OK and coll.error_type is None


async def test_collection_set_may_name_its_checkpoint_late() -> None:
    """A collection that learns its checkpoint id inside the block reports it on its Finished event."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="controller", instance="coordination")
        with tel.collection("checkpoint") as collection:
            collection.set(checkpoint_id="ck-late", rows=0)
    assert _only(events, CollectionStarted).checkpoint_id is None
    assert _only(events, CollectionFinished).checkpoint_id == "ck-late"


@pytest.mark.parametrize("bad", [-1, True, 2.0, "3"])
async def test_counts_must_be_non_negative_ints(bad: object) -> None:
    """Every count of the three handles refuses what is not an int >= 0."""
    async with capture_events() as (bus, _):
        tel = Telemetry(bus, kind="controller", instance="coordination")
        with tel.collection("checkpoint") as collection, tel.coordinate("prepare") as coordinate:
            with coordinate.stage("agent") as stage:
                with pytest.raises(InvalidArgumentError, match="participants"):
                    stage.set(participants=bad)  # type: ignore[arg-type]
            for name in ("participants", "episodes", "rollouts"):
                with pytest.raises(InvalidArgumentError, match=name):
                    coordinate.set(**{name: bad})  # type: ignore[arg-type]
            for name in ("in_flight", "rows", "restarts"):
                with pytest.raises(InvalidArgumentError, match=name):
                    collection.set(**{name: bad})  # type: ignore[arg-type]
