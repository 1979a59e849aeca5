"""The export process's pipe (``_export_wire``): span handles written as they are, read back as
the very events an in-process sink gets from the same bus."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ckpt_events import Bus, Event, OperationFinished, OperationStarted, StepFinished, StepStarted, Telemetry
from ckpt_events._span_handles import OperationSpan, StepSpan
from ckpt_events.sinks._export_wire import (
    OperationRecord,
    StepRecord,
    encoder,
    read_batch,
    whole_events,
    wire_items,
)

pytestmark = pytest.mark.anyio


class Cooked:
    """An ordinary sink: the events the bus builds for it."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def handle(self, batch: list[Event]) -> None:
        self.events.extend(batch)


class Wire:
    """A sink taking the handles raw, as ``ExportProcess`` does: each batch written as the pipe's
    line and read back as the child reads it."""

    _takes_span_handles = True

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.lines: list[bytes] = []
        self.items: list[Any] = []
        self._encoder = encoder()

    def handle(self, batch: list[Any]) -> None:
        self.items.extend(batch)
        line = self._encoder.encode(wire_items(batch))
        self.lines.append(line)
        self.events.extend(read_batch(line))


def test_the_records_are_the_handles_fields_in_order() -> None:
    """The child decodes a handle by position: a field added to a handle and not to its record
    (or moved) would shift every field after it."""
    for handle, record in ((OperationSpan, OperationRecord), (StepSpan, StepRecord)):
        assert handle.__struct_fields__ == record.__struct_fields__
        assert handle.__struct_config__.tag == record.__struct_config__.tag
        assert handle.__struct_config__.array_like and record.__struct_config__.array_like


def _work(tel: Telemetry) -> None:
    with tel.operation("commit", checkpoint_id="c1") as op:
        op.set_attribute("gym.user", "u1")
        with op.step("export") as step:
            step.set(records=3, bytes=7)
        with op.step("upload") as step:
            step.set(calls=2)
        op.set(records=3, bytes=7, phase="committed", episodes=2, rollouts=5, received_ns=11, loop_lag_ms=0.5)
    with pytest.raises(ZeroDivisionError), tel.operation("restore", checkpoint_id="c1") as op:
        with op.step("install"):
            1 / 0  # noqa: B018
    tel.refused("stale_checkpoint", checkpoint_id="c9")  # an event that is no span handle
    with tel.operation("prepare", traceparent="00-" + "ab" * 16 + "-" + "cd" * 8 + "-01") as op:
        pass


async def test_the_child_reads_the_events_an_in_process_sink_gets() -> None:
    cooked, wire = Cooked(), Wire()
    async with Bus() as bus:
        bus.subscribe(cooked)
        sub = bus.subscribe(wire)
        assert sub._buffer.raw
        tel = Telemetry(bus, kind="resources", instance="resources-0", worker=3)
        _work(tel)
        await bus.flush()
    assert len(cooked.events) == 13
    assert wire.events == cooked.events
    # The server built no event for its own spans on this sink's way: it got the handles.
    handles = [item for item in wire.items if isinstance(item, OperationSpan | StepSpan)]
    assert len(handles) == 12 and len(wire.items) == 13


async def test_alone_on_the_bus_the_request_path_builds_no_started_event() -> None:
    wire = Wire()
    async with Bus() as bus:
        bus.subscribe(wire)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        with tel.operation("commit") as op:
            with op.step("export"):
                buffered = list(bus._subscriptions[0]._buffer)
                assert [type(item) for item in buffered] == [OperationSpan, StepSpan]
        await bus.flush()
    assert [type(e) for e in wire.events] == [OperationStarted, StepStarted, StepFinished, OperationFinished]


async def test_a_span_open_across_batches_starts_in_one_line_and_ends_in_a_later_one() -> None:
    wire = Wire()
    async with Bus(batch_interval=0) as bus:
        bus.subscribe(wire)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        with tel.operation("commit") as op:
            await bus.flush()
            assert [type(e) for e in wire.events] == [OperationStarted]
            op.set(records=1)
        await bus.flush()
    assert len(wire.lines) >= 2
    started, finished = wire.events
    assert isinstance(finished, OperationFinished) and finished.records == 1
    assert (started.span_id, started.start_ns) == (finished.span_id, finished.start_ns)


async def test_a_start_the_buffer_had_no_room_for_leaves_the_end_alone() -> None:
    """A start dropped (counted) for want of room: the handle met later is its end, never a
    second start, and the next span pairs up again."""
    wire = Wire()
    async with Bus() as bus:
        sub = bus.subscribe(wire, buffer_size=1)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        with tel.operation("commit") as op:  # its start fills the buffer
            with op.step("export"):  # no room: this start is dropped
                pass  # and so is this end
            await bus.flush()
        await bus.flush()
        with tel.operation("restore"):
            await bus.flush()
        await bus.flush()
    assert [type(e) for e in wire.events] == [
        OperationStarted,
        OperationFinished,
        OperationStarted,
        OperationFinished,
    ]
    assert sub.stats().dropped == 2


async def test_one_raw_buffer_per_bus_a_second_such_sink_gets_events() -> None:
    first, second = Wire(), Wire()
    async with Bus() as bus:
        a, b = bus.subscribe(first), bus.subscribe(second)
        assert a._buffer.raw and not b._buffer.raw
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        _work(tel)
        await bus.flush()
    assert first.events == second.events and len(first.events) == 13
    assert all(isinstance(item, Event) for item in second.items)


async def test_entering_a_handle_twice_queues_one_start() -> None:
    wire, cooked = Wire(), Cooked()
    async with Bus() as bus:
        bus.subscribe(wire)
        bus.subscribe(cooked)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        op = tel.operation("commit")
        with op, op:
            pass
        await bus.flush()
    # The cooked sink keeps the handles' old behaviour (a start per enter); the wire never
    # takes a second meeting for the end: one start, one end.
    assert [type(e) for e in wire.events] == [OperationStarted, OperationFinished]


async def test_a_bridged_operation_goes_as_its_events() -> None:
    class Bridge:
        def current_parent(self) -> None:
            return None

        def attach(self, trace_id: int, span_id: int, sampled: bool) -> object:
            return object()

        def detach(self, token: object) -> None:
            pass

    wire, cooked = Wire(), Cooked()
    async with Bus() as bus:
        bus.subscribe(cooked)
        bus.subscribe(wire)
        tel = Telemetry(bus, kind="resources", instance="resources-0", otel_context=Bridge())
        _work(tel)
        await bus.flush()
    assert wire.events == cooked.events and len(wire.events) == 13


async def test_a_line_cut_short_keeps_its_whole_items() -> None:
    wire = Wire()
    async with Bus() as bus:
        bus.subscribe(wire)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        _work(tel)
        await bus.flush()
    line = b"".join(wire.lines[:1])
    whole = read_batch(line)
    assert whole_events(line[:-1]) == whole  # only the closing bracket lost
    items = msgspec.json.decode(line)
    assert any(isinstance(item, str) for item in items)  # an end naming its start's record
    # Cut inside each item in turn: what comes back is the items before it (a start mark whose
    # span was cut left out), never an error and never a half item.
    for i in range(1, len(items)):
        kept = items[: i - 1] if items[i - 1] == 0 else items[:i]
        whole_item = msgspec.json.encode(items[i])
        for size in (1, 2, 5):  # an end's '"12"' cut to '"1' names no other record
            if size < len(whole_item):
                cut = msgspec.json.encode(items[:i])[:-1] + b"," + whole_item[:size]
                assert whole_events(cut) == read_batch(msgspec.json.encode(kept))
    assert whole_events(b"[0") == [] and whole_events(b"") == []


def test_a_line_that_is_not_the_pipes_is_refused() -> None:
    for line in (b"[1]", b"[0]", b"[0,0,[]]", b'["x"]', b"[[1,2]]", b"[0,{}]"):
        with pytest.raises(msgspec.DecodeError):
            read_batch(line)


async def test_a_span_started_and_ended_in_one_line_has_its_fields_written_once() -> None:
    """Its end is its start's record's index (a string), so the server encodes each such handle
    once and the line is half as long; the child still gets both events, each in its place."""
    wire = Wire()
    async with Bus() as bus:
        bus.subscribe(wire)
        tel = Telemetry(bus, kind="resources", instance="resources-0")
        for _ in range(5):  # indices of two digits, as a busy server's lines hold
            with tel.operation("commit") as op, op.step("export"):
                pass
        await bus.flush()
    (line,) = wire.lines
    items = msgspec.json.decode(line)
    records = [item for item in items if isinstance(item, list)]
    ends = [item for item in items if isinstance(item, str)]
    assert len(records) == len(ends) == 10 and items.count(0) == 10
    assert max(int(end) for end in ends) >= 10
    for position, end in ((i, int(item)) for i, item in enumerate(items) if isinstance(item, str)):
        assert items[end - 1] == 0 and isinstance(items[end], list) and end < position
    kinds = [type(e).__name__ for e in wire.events]
    assert kinds[:4] == ["OperationStarted", "StepStarted", "StepFinished", "OperationFinished"]
    assert len(wire.events) == 20


def test_an_end_that_names_no_start_of_its_line_is_refused() -> None:
    record = msgspec.json.encode(
        ["step", ["resources", "r0", None], "export", None, 1, 2, 3, True, None, False]
        + [1, 2, 3, None, "ok", None, None, None, None, None, None, None, None, 2]
    )
    assert len(read_batch(b"[0," + record + b',"1"]')) == 2  # well formed: its start and its end
    for tail in (b',"1","1"]', b',"2"]', b',"0"]', b',"x"]', b',"-1"]', b',"1 "]', b',"\xd9\xa1"]'):
        with pytest.raises(msgspec.DecodeError):
            read_batch(b"[0," + record + tail)
    with pytest.raises(msgspec.DecodeError):
        read_batch(b"[" + record + b"," + record + b',"1"]')  # that record is an end, not a start
    with pytest.raises(msgspec.DecodeError):
        read_batch(b'["1",0,' + record + b"]")  # named before it
