"""Finished operations and steps are queued as their span handles and built into events by
each sink's delivery task: what a sink receives must not change because of it."""

from __future__ import annotations

import gc
import threading
from typing import Any

import anyio

from ckpt_events import Bus, OperationFinished, StepFinished, Telemetry
from ckpt_events._events import Event
from ckpt_events.testing import MemorySink
from ckpt_events.vocab import Outcome


def _interested() -> MemorySink:
    """A memory sink that wants only the finished operation and step events."""
    return MemorySink((OperationFinished, StepFinished))


def _one_operation(tel: Telemetry, fail: bool = False) -> None:
    with tel.operation("commit", checkpoint_id="c1") as op:
        with op.step("export") as step:
            step.set(records=3)
        op.set(records=3, bytes=10)
        if fail:
            raise KeyError("boom")


async def test_every_sink_gets_events_not_handles_and_the_same_event_object() -> None:
    """Two sinks get real events, equal field by field, built once and shared."""
    first, second = _interested(), _interested()
    async with Bus() as bus:
        bus.subscribe(first)
        bus.subscribe(second)
        _one_operation(Telemetry(bus, kind="resources", instance="r0"))
        await bus.flush()
    assert [type(e) for e in first.events] == [StepFinished, OperationFinished]
    assert all(isinstance(e, Event) for e in first.events + second.events)
    assert all(a is b for a, b in zip(first.events, second.events, strict=True))
    step, op = first.events
    assert (step.records, op.records, op.bytes, op.outcome) == (3, 3, 10, Outcome.OK)
    assert step.parent_span_id == op.span_id and step.trace_id == op.trace_id


async def test_an_error_is_recorded_when_the_block_ends() -> None:
    """The exception's type and message are taken at exit: the handle keeps no exception
    (which would tie it to the frame and its traceback)."""
    sink = _interested()
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="r0")
        try:
            _one_operation(tel, fail=True)
        except KeyError:
            pass
        await bus.flush()
    op = sink.events[-1]
    assert (op.outcome, op.error_type, op.error_message) == (Outcome.ERROR, "KeyError", "'boom'")


async def test_live_handles_are_not_tracked_by_the_garbage_collector() -> None:
    """The request path adds nothing for the cyclic collector to scan; what a handle holds
    is the Telemetry, names, ids and scalars (no exception, no frame)."""
    async with Bus() as bus:
        bus.subscribe(_interested())
        tel = Telemetry(bus, kind="resources", instance="r0")
        with tel.operation("commit") as op, op.step("export") as step:
            step.set_attribute("note", "x")
            assert not gc.is_tracked(op) and not gc.is_tracked(step)
            for referent in gc.get_referents(step):
                assert referent is tel or isinstance(referent, str | int | float | bool | dict | type(None))


async def test_a_full_buffer_drops_finished_handles_and_counts_them() -> None:
    """Handles are offered like events: beyond the buffer they are dropped and counted."""
    sink = _interested()
    bus = Bus(buffer_size=4)
    sub = bus.subscribe(sink, name="small")
    tel = Telemetry(bus, kind="resources", instance="r0")
    for _ in range(3):  # before the bus runs: 6 finished spans into a buffer of 4
        _one_operation(tel)
    async with bus:
        await bus.flush()
    assert len(sink.events) == 4
    stats = sub.stats()
    assert (stats.emitted, stats.delivered, stats.dropped) == (6, 4, 2)


async def test_spans_finished_on_another_thread_arrive_as_events() -> None:
    """A handle queued from a worker thread is built into its event on the loop."""
    sink = _interested()
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="r0")
        threads = [threading.Thread(target=_one_operation, args=(tel,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            await anyio.to_thread.run_sync(thread.join, 10.0)
        await bus.flush()
    assert len(sink.events) == 8
    ops: dict[int, Any] = {e.span_id: e for e in sink.events if isinstance(e, OperationFinished)}
    steps = [e for e in sink.events if isinstance(e, StepFinished)]
    assert len(ops) == 4 and {s.parent_span_id for s in steps} == set(ops)


def test_every_live_handle_class_is_known_to_the_delivery() -> None:
    """Delivery converts by exact type: a handle subclass (the OpenTelemetry-bridged
    operation, say) must be registered, or its instances would reach sinks unconverted."""
    import ckpt_events._context_bridge  # noqa: F401  (defines BridgedOperationSpan)
    from ckpt_events._span_handles import QUEUED_HANDLES, OperationSpan, StepSpan

    def subclasses(cls: type) -> set[type]:
        found = {cls}
        for sub in cls.__subclasses__():
            found |= subclasses(sub)
        return found

    every = subclasses(OperationSpan) | subclasses(StepSpan)
    assert len(every) >= 3 and every <= QUEUED_HANDLES


async def test_a_batch_mixing_events_and_handles_arrives_in_emit_order() -> None:
    """Counted events emitted between spans stay in place among the converted spans."""
    sink = MemorySink()
    async with Bus() as bus:
        bus.subscribe(sink)
        tel = Telemetry(bus, kind="resources", instance="r0")
        with tel.operation("commit") as op:
            tel.refused("stale_attempt")
            with op.step("export"):
                pass
            tel.refused("admission_closed")
        await bus.flush()
    names = [type(e).__name__ for e in sink.events]
    assert names == [
        "OperationStarted",
        "Refused",
        "StepStarted",
        "StepFinished",
        "Refused",
        "OperationFinished",
    ]
