"""Guards for the speed tricks: positional event construction and the no-op twins.

The emitter builds events by position (about 13x faster than by keyword), so a field built in
the wrong slot would be accepted silently. Here every settable field of every span kind is
given a distinct value through the public API and must land in its own field.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from ckpt_events import (
    CollectionFinished,
    CollectionStarted,
    CoordinateFinished,
    CoordinateStarted,
    GenerationCut,
    InvalidArgumentError,
    LeaseExpired,
    OperationFinished,
    OperationStarted,
    PrepareNotReady,
    Refused,
    StageFinished,
    StageStarted,
    Stalled,
    StepFinished,
    StepStarted,
    Telemetry,
    format_traceparent,
)
from ckpt_events._controller_spans import CollectionSpan, CoordinateSpan, StageSpan
from ckpt_events._events import EVENT_TYPES
from ckpt_events._noop import NOOP_COLLECTION, NOOP_COORDINATE, NOOP_OPERATION
from ckpt_events._span_handles import OperationSpan, StepSpan
from ckpt_events.testing import capture_events
from ckpt_events.vocab import Disposition, ErrorCode, Kind, Outcome, Phase

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
REMOTE_PARENT = 0xB7AD6B7169203331


def _only(events: list[Any], cls: type) -> Any:
    found = [e for e in events if type(e) is cls]
    assert len(found) == 1, (cls.__name__, found)
    return found[0]


def _fields(event: Any) -> dict[str, Any]:
    return {name: getattr(event, name) for name in event.__struct_fields__}


async def test_operation_and_step_fields_land_in_their_own_slots() -> None:
    """Operation and step: each of their settable fields is given a distinct value and read back."""
    header = format_traceparent(TRACE_ID, REMOTE_PARENT)
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="model", instance="model-7")
        with tel.operation("prepare", checkpoint_id="ck-1", traceparent=header) as op:
            with op.step("generation_cut") as step:
                step.set(records=11, bytes=12, calls=13, cut_durable_prefix=14, cut_durable_failure=15)
                step.set_attribute("user.step", "s")
            op.set(records=21, bytes=22, phase="preparing", blockers=23, episodes=24, rollouts=25)
            op.set(received_ns=27, loop_lag_ms=28.5)
            op.set_attribute("user.op", 26)
    started, finished = _only(events, OperationStarted), _only(events, OperationFinished)
    step_started, step_finished = _only(events, StepStarted), _only(events, StepFinished)

    assert _fields(finished) == {
        "kind": Kind.MODEL,
        "instance": "model-7",
        "trace_id": TRACE_ID,
        "span_id": started.span_id,
        "start_ns": started.start_ns,
        "end_ns": finished.end_ns,
        "operation": "prepare",
        "checkpoint_id": "ck-1",
        "parent_span_id": REMOTE_PARENT,
        "parent_remote": True,
        "sampled": True,
        "outcome": Outcome.OK,
        "error_type": None,
        "error_message": None,
        "attributes": {"user.op": 26},
        "phase": Phase.PREPARING,
        "blockers": 23,
        "records": 21,
        "bytes": 22,
        "episodes": 24,
        "rollouts": 25,
        "received_ns": 27,
        "loop_lag_ms": 28.5,
        "worker": None,
    }
    assert _fields(step_finished) == {
        "kind": Kind.MODEL,
        "instance": "model-7",
        "trace_id": TRACE_ID,
        "span_id": step_started.span_id,
        "start_ns": step_started.start_ns,
        "end_ns": step_finished.end_ns,
        "step": "generation_cut",
        "checkpoint_id": "ck-1",
        "parent_span_id": started.span_id,
        "parent_remote": False,
        "sampled": True,
        "outcome": Outcome.OK,
        "error_type": None,
        "error_message": None,
        "attributes": {"user.step": "s"},
        "records": 11,
        "bytes": 12,
        "calls": 13,
        "cut_durable_prefix": 14,
        "cut_durable_failure": 15,
        "worker": None,
    }
    assert started.start_ns <= step_started.start_ns <= step_finished.end_ns <= finished.end_ns
    assert len({started.span_id, step_started.span_id, REMOTE_PARENT}) == 3


async def test_failed_operation_fills_the_error_fields() -> None:
    """An exception fills outcome, error_type and error_message, each in its own field."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="agent", instance="agent-3")
        with pytest.raises(KeyError), tel.operation("commit", checkpoint_id="ck-2") as op:
            with op.step("write"):
                raise KeyError("disk")
    for cls in (OperationFinished, StepFinished):
        event = _only(events, cls)
        assert (event.outcome, event.error_type, event.error_message) == (
            Outcome.ERROR,
            "KeyError",
            "'disk'",
        )
        assert event.parent_remote is False


@pytest.mark.parametrize(("prepared", "stop", "published"), [(True, True, False), (False, False, True)])
async def test_controller_span_fields_land_in_their_own_slots(
    prepared: bool, stop: bool, published: bool
) -> None:
    """Coordinate, stage and collection spans: distinct values (booleans both ways) read back."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="controller", instance="coordination")
        with tel.collection("checkpoint", checkpoint_id="ck-3") as collection:
            with tel.coordinate("prepare", checkpoint_id="ck-3", parent=collection) as coordinate:
                with coordinate.stage("agent") as stage:
                    stage.set(participants=31)
                    stage.set_attribute("user.stage", True)
                coordinate.set(
                    participants=41, prepared=prepared, stopped_at="agent", episodes=42, rollouts=43
                )
            collection.set(in_flight=51, stop=stop, published=published, rows=52, restarts=53)
    coll_started, coll = _only(events, CollectionStarted), _only(events, CollectionFinished)
    coord_started, coord = _only(events, CoordinateStarted), _only(events, CoordinateFinished)
    stage_started, stage_end = _only(events, StageStarted), _only(events, StageFinished)

    common = {"kind": Kind.CONTROLLER, "instance": "coordination", "checkpoint_id": "ck-3", "sampled": True}
    base = {"parent_remote": False, "outcome": Outcome.OK, "error_type": None, "error_message": None}
    assert _fields(coll) == {
        **common,
        **base,
        "trace_id": coll_started.trace_id,
        "span_id": coll_started.span_id,
        "start_ns": coll_started.start_ns,
        "end_ns": coll.end_ns,
        "action": "checkpoint",
        "parent_span_id": None,
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
    }
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


async def test_point_events_land_in_their_own_slots() -> None:
    """The four counted events carry their values in their own fields."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="resources", instance="resources-9")
        tel.refused("stale_attempt", checkpoint_id="ck-a")
        tel.lease_expired("prepared", checkpoint_id="ck-b")
        tel.prepare_not_ready(61, checkpoint_id="ck-c")
        tel.generation_cut("durable_failure", 62, checkpoint_id="ck-d")
    refused, lease = _only(events, Refused), _only(events, LeaseExpired)
    not_ready, cut = _only(events, PrepareNotReady), _only(events, GenerationCut)
    assert (refused.code, refused.checkpoint_id) == (ErrorCode.STALE_ATTEMPT, "ck-a")
    assert (lease.phase, lease.checkpoint_id) == (Phase.PREPARED, "ck-b")
    assert (not_ready.blockers, not_ready.checkpoint_id) == (61, "ck-c")
    assert (cut.disposition, cut.calls, cut.checkpoint_id) == (Disposition.DURABLE_FAILURE, 62, "ck-d")
    for event in (refused, lease, not_ready, cut):
        assert (event.kind, event.instance) == (Kind.RESOURCES, "resources-9")


async def test_worker_lands_in_its_own_slot_of_every_event() -> None:
    """A worker's Telemetry puts its index in the last field of every event type, nowhere else."""
    async with capture_events() as (bus, events):
        tel = Telemetry(bus, kind="agent", instance="agent-4", worker=3)
        with tel.collection("checkpoint", checkpoint_id="ck-w") as collection:
            with tel.coordinate("prepare", checkpoint_id="ck-w", parent=collection) as coordinate:
                with coordinate.stage("agent"):
                    pass
        with tel.operation("commit", checkpoint_id="ck-w") as op:
            with op.step("write") as step:
                step.set(cut_durable_failure=7)
            op.set(rollouts=8)
        tel.refused("stale_attempt", checkpoint_id="ck-w")
        tel.lease_expired("prepared", checkpoint_id="ck-w")
        tel.prepare_not_ready(5, checkpoint_id="ck-w")
        tel.generation_cut("durable_failure", 6, checkpoint_id="ck-w")
    # Stalled is built by sinks.StallWatch from the stalled operation's own identity (worker
    # included, tests/sinks/test_stall_watch.py), never by a Telemetry.
    assert {type(e) for e in events} == set(EVENT_TYPES) - {Stalled}
    for event in events:
        assert event.__struct_fields__[-1] == "worker"
        assert (event.worker, event.checkpoint_id) == (3, "ck-w"), event
    assert _only(events, StepFinished).cut_durable_failure == 7
    assert _only(events, OperationFinished).rollouts == 8
    assert _only(events, GenerationCut).calls == 6


@pytest.mark.parametrize("bad", [-1, True, 1.0, "2"])
def test_worker_must_be_a_non_negative_int(bad: object) -> None:
    """A worker index that is not an int >= 0 is refused when the Telemetry is built."""
    with pytest.raises(InvalidArgumentError):
        Telemetry(None, kind="agent", instance="agent-4", worker=bad)  # type: ignore[arg-type]


def _public_methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") or name in ("__enter__", "__exit__")
    }


@pytest.mark.parametrize(
    ("live", "noop"),
    [
        (OperationSpan, type(NOOP_OPERATION)),
        (StepSpan, type(NOOP_OPERATION.step("write"))),
        (CoordinateSpan, type(NOOP_COORDINATE)),
        (StageSpan, type(NOOP_COORDINATE.stage("agent"))),
        (CollectionSpan, type(NOOP_COLLECTION)),
    ],
)
def test_noop_handles_have_the_live_signatures(live: type, noop: type) -> None:
    """Each no-op twin's public methods take exactly the live handle's parameters."""
    live_methods, noop_methods = _public_methods(live), _public_methods(noop)
    for name, signature in live_methods.items():
        twin = noop_methods[name]
        assert list(twin.parameters.values()) == list(signature.parameters.values()), name
