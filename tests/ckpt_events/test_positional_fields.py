"""Guards for the speed tricks: positional event construction.

The emitter builds events by position (about 13x faster than by keyword), so a field built in
the wrong slot would be accepted silently. Every settable field is given a distinct value
through the public API and must land in its own field: the counted events and the worker
here, the span handles in ``test_span_handles.py`` and ``test_controller_spans.py``, the
no-op twins' signatures in ``test_noop.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_events import (
    CoordinateFinished,
    GenerationCut,
    InvalidArgumentError,
    LeaseExpired,
    OperationFinished,
    PrepareNotReady,
    Refused,
    SpanEvent,
    Stalled,
    StepFinished,
    Telemetry,
)
from ckpt_events._events import EVENT_TYPES
from ckpt_events.testing import capture_events
from ckpt_events.vocab import Disposition, ErrorCode, Kind, Phase


def _only(events: list[Any], cls: type) -> Any:
    found = [e for e in events if type(e) is cls]
    assert len(found) == 1, (cls.__name__, found)
    return found[0]


def _fields(event: Any) -> dict[str, Any]:
    return {name: getattr(event, name) for name in event.__struct_fields__}


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
        # Last, but for a span event's tracestate and a root's monotonic start (added after it:
        # older logs read them as None).
        last = ("worker", "tracestate") if isinstance(event, SpanEvent) else ("worker",)
        if isinstance(event, CoordinateFinished):
            last = (*last, "monotonic_start_ns")
        assert event.__struct_fields__[-len(last) :] == last
        assert (event.worker, event.checkpoint_id) == (3, "ck-w"), event
    assert _only(events, StepFinished).cut_durable_failure == 7
    assert _only(events, OperationFinished).rollouts == 8
    assert _only(events, GenerationCut).calls == 6


@pytest.mark.parametrize("bad", [-1, True, 1.0, "2"])
def test_worker_must_be_a_non_negative_int(bad: object) -> None:
    """A worker index that is not an int >= 0 is refused when the Telemetry is built."""
    with pytest.raises(InvalidArgumentError):
        Telemetry(None, kind="agent", instance="agent-4", worker=bad)  # type: ignore[arg-type]
